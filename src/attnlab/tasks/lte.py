"""Learning to Execute (Zaremba & Sutskever 2014; UT paper Tables 5-6), generated offline from a seed.

Program evaluation (``variant`` program | control | addition): short Python-like programs whose target is
what ``print`` writes. The generator follows the released code of Zaremba & Sutskever
(``wojciechz/learning_to_execute``: ``compose`` over a stack of operations) with its two knobs, ``length``
(digits of the numbers) and ``nesting`` (how many operations are composed). Operations:

- ``pair``: ``(a+b)`` / ``(a-b)``;  ``smallmul``: ``(a*k)`` / ``(k*a)`` with k in 1..4*length;
- ``equality``: the operand itself;  ``vars``: ``v=a;`` then ``(v+b)`` / ``(v-b)``;
- ``small_loop``: ``v=a`` then ``for x in range(k):v+=b`` (or ``-=``), k in 1..4*length;
- ``ifstat``: ``(c if a>b else d)`` (or ``<``).

Each operation takes its operands from the stack of earlier results (fresh random numbers of up to
``length`` digits when it is empty), in a random order, and pushes its result; the last result is printed.
``program`` uses all six operations, ``control`` only the control-flow ones (``ifstat``, ``small_loop``:
our reading of the UT paper's "control" subset, which the paper does not define further) and ``addition``
is Zaremba & Sutskever's addition task, ``print(a+b)`` with two ``length``-digit numbers.

Memorization (``variant`` copy | double | reverse; UT Table 5): the target is a random number of up to
``length`` digits (55 in the paper); the input is the number (copy), the number written twice (double:
Zaremba & Sutskever's "input doubling") or the number reversed (reverse: their "input reversing").

Data generation is Zaremba & Sutskever's "mix" strategy without curriculum (UT Table 6 note): every
training example draws its nesting in 1..nesting and every number its digit count in 1..length;
validation and test use exactly ``length`` and ``nesting`` (their test "target hardness"). As in their
code, an example goes to train / val / test by a hash of its text modulo 3, so no program text is in two
splits. Targets are computed by running the generated text through this module's own small interpreter
(tokenizer, recursive-descent parser, evaluator; no ``exec``/``eval``), and checked against the value the
generator tracked while composing the program.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Callable
from typing import Any

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import PairDataset
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.vocab import Vocab, symbol_seq2seq_task

OPERATIONS = ("pair", "smallmul", "equality", "vars", "small_loop", "ifstat")
PROGRAM_VARIANTS = {"program": OPERATIONS, "control": ("ifstat", "small_loop"), "addition": ()}
MEMORIZATION_VARIANTS = ("copy", "double", "reverse")
VARIABLES = "abcdefghij"
# Every character a generated program, input or target can contain (the character vocabulary).
CHARSET = "0123456789" + "abcdefghijklmnopqrstuvwxyz" + "()+-*=<>:;., \n"


# -- interpreter ------------------------------------------------------------------------------------------
class ProgramError(DataError):
    """A program text that the interpreter cannot tokenize, parse or run."""


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_]\w*)|(\+=|-=|\*=|==|!=|<=|>=|[-+*=<>():;,]))")
_KEYWORDS = {"for", "in", "range", "print", "if", "else"}


def _tokenize_line(line: str, number: int) -> list[tuple[str, Any]]:
    out, pos = [], 0
    stripped = line.rstrip()
    while pos < len(stripped):
        m = _TOKEN.match(stripped, pos)
        if not m or m.end() == pos:
            raise ProgramError(f"program line {number}: cannot read {stripped[pos:]!r}")
        pos = m.end()
        if m.group(1) is not None:
            out.append(("int", int(m.group(1))))
        elif m.group(2) is not None:
            word = m.group(2)
            out.append(("kw", word) if word in _KEYWORDS else ("name", word))
        else:
            out.append(("op", m.group(3)))
    return out


class _Parser:
    """Recursive descent over one line's tokens; statements become closures over an environment dict."""

    def __init__(self, tokens: list[tuple[str, Any]], number: int) -> None:
        self.tokens, self.i, self.number = tokens, 0, number

    def error(self, what: str) -> ProgramError:
        return ProgramError(f"program line {self.number}: {what}")

    def peek(self, kind: str | None = None, value: Any = None) -> bool:
        if self.i >= len(self.tokens):
            return False
        k, v = self.tokens[self.i]
        return (kind is None or k == kind) and (value is None or v == value)

    def take(self, kind: str, value: Any = None):
        if not self.peek(kind, value):
            got = self.tokens[self.i][1] if self.i < len(self.tokens) else "end of line"
            raise self.error(f"expected {value or kind}, got {got!r}")
        self.i += 1
        return self.tokens[self.i - 1][1]

    def done(self) -> bool:
        return self.i >= len(self.tokens)

    # statements: print(expr) | for NAME in range(expr): simple | NAME (=|+=|-=|*=) expr [;]
    def statement(self) -> Callable[[dict, list], None]:
        if self.peek("kw", "print"):
            self.take("kw", "print")
            self.take("op", "(")
            expr = self.test()
            self.take("op", ")")
            return lambda env, out: out.append(_show(expr(env)))
        if self.peek("kw", "for"):
            self.take("kw", "for")
            var = self.take("name")
            self.take("kw", "in")
            self.take("kw", "range")
            self.take("op", "(")
            count = self.test()
            self.take("op", ")")
            self.take("op", ":")
            body = self.simple()
            number = self.number

            def loop(env, out):
                n = count(env)
                if not isinstance(n, int) or n > 1_000_000:
                    raise ProgramError(f"program line {number}: range({n!r}) is not a small integer")
                for k in range(n):
                    env[var] = k
                    body(env, out)

            return loop
        return self.simple()

    def simple(self) -> Callable[[dict, list], None]:
        name = self.take("name")
        op = self.take("op")
        if op not in ("=", "+=", "-=", "*="):
            raise self.error(f"expected an assignment after {name!r}, got {op!r}")
        expr = self.test()
        if self.peek("op", ";"):
            self.take("op", ";")
        number = self.number

        def assign(env, out):
            value = expr(env)
            if op == "=":
                env[name] = value
                return
            if name not in env:
                raise ProgramError(f"program line {number}: {name!r} is not defined")
            env[name] = {"+=": _add, "-=": _sub, "*=": _mul}[op](env[name], value)

        return assign

    # expressions, with Python's precedence: conditional < comparison < +,- < * < unary < atom
    def test(self):
        body = self.comparison()
        if self.peek("kw", "if"):
            self.take("kw", "if")
            cond = self.comparison()
            self.take("kw", "else")
            other = self.test()
            return lambda env: body(env) if cond(env) else other(env)
        return body

    def comparison(self):
        left = self.arith()
        ops = {"<": lambda a, b: a < b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b,
               ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
        if self.i < len(self.tokens) and self.tokens[self.i][0] == "op" and self.tokens[self.i][1] in ops:
            fn = ops[self.take("op")]
            right = self.arith()
            return lambda env: fn(left(env), right(env))
        return left

    def arith(self):
        expr = self.term()
        while self.peek("op", "+") or self.peek("op", "-"):
            fn = _add if self.take("op") == "+" else _sub
            expr = (lambda f, a, b: lambda env: f(a(env), b(env)))(fn, expr, self.term())
        return expr

    def term(self):
        expr = self.factor()
        while self.peek("op", "*"):
            self.take("op", "*")
            expr = (lambda a, b: lambda env: _mul(a(env), b(env)))(expr, self.factor())
        return expr

    def factor(self):
        if self.peek("op", "-"):
            self.take("op", "-")
            inner = self.factor()
            return lambda env: -inner(env)
        if self.peek("op", "+"):
            self.take("op", "+")
            return self.factor()
        return self.atom()

    def atom(self):
        if self.peek("int"):
            value = self.take("int")
            return lambda env: value
        if self.peek("name"):
            name, number = self.take("name"), self.number

            def lookup(env):
                if name not in env:
                    raise ProgramError(f"program line {number}: {name!r} is not defined")
                return env[name]

            return lookup
        if self.peek("op", "("):
            self.take("op", "(")
            inner = self.test()
            self.take("op", ")")
            return inner
        got = self.tokens[self.i][1] if self.i < len(self.tokens) else "end of line"
        raise self.error(f"expected a number, a variable or '(', got {got!r}")


def _add(a, b):
    return a + b


def _sub(a, b):
    return a - b


def _mul(a, b):
    return a * b


def _show(value) -> str:
    return str(value)  # Python's print: ints as decimal (with '-'), booleans as True / False


def run_program(text: str) -> str:
    """What ``print`` writes when the program ``text`` runs (lines joined by newlines, no trailing one)."""
    env: dict[str, Any] = {}
    out: list[str] = []
    for number, line in enumerate(text.split("\n"), 1):
        tokens = _tokenize_line(line, number)
        if not tokens:
            continue
        parser = _Parser(tokens, number)
        stmt = parser.statement()
        if not parser.done():
            raise parser.error(f"unexpected {parser.tokens[parser.i][1]!r} after the statement")
        stmt(env, out)
    return "\n".join(out)


# -- generator --------------------------------------------------------------------------------------------
Hardness = Callable[[], tuple[int, int]]


class _Composer:
    """One program: Zaremba & Sutskever's ``compose`` with a stack of (expression, value) results."""

    def __init__(self, rng: random.Random, hardness: Hardness) -> None:
        self.rng, self.hardness = rng, hardness
        self.stack: list[tuple[str, int]] = []
        self.free_vars = rng.sample(VARIABLES, len(VARIABLES))

    def number(self) -> int:
        length = self.hardness()[0]
        return self.rng.randint(1, 10**length - 1)

    def operand(self) -> tuple[str, int]:
        if self.stack:
            return self.stack.pop()
        value = self.number()
        return str(value), value

    def operands(self, n: int) -> list[tuple[str, int]]:
        slots: list[Any] = [None] * n
        for slot in self.rng.sample(range(n), n):  # earlier results land in a random position
            slots[slot] = self.operand()
        return slots

    def variable(self) -> str:
        if not self.free_vars:
            raise DataError(f"LTE: more than {len(VARIABLES)} variables needed; lower task.nesting")
        return self.free_vars.pop(0)

    def small(self) -> int:
        return self.rng.randint(1, 4 * self.hardness()[0])

    def op_pair(self):
        (ea, a), (eb, b) = self.operands(2)
        if self.rng.random() < 0.5:
            return [], f"({ea}+{eb})", a + b
        return [], f"({ea}-{eb})", a - b

    def op_smallmul(self):
        e, v = self.operand()
        k = self.small()
        expr = f"({e}*{k})" if self.rng.random() < 0.5 else f"({k}*{e})"
        return [], expr, v * k

    def op_equality(self):
        e, v = self.operand()
        return [], e, v

    def op_vars(self):
        var = self.variable()
        (ea, a), (eb, b) = self.operands(2)
        if self.rng.random() < 0.5:
            return [f"{var}={ea};"], f"({var}+{eb})", a + b
        return [f"{var}={ea};"], f"({var}-{eb})", a - b

    def op_small_loop(self):
        var = self.variable()
        (ea, a), (eb, b) = self.operands(2)
        k = self.small()
        plus = self.rng.random() < 0.5
        code = [f"{var}={ea}", f"for x in range({k}):{var}{'+' if plus else '-'}={eb}"]
        return code, var, a + k * b if plus else a - k * b

    def op_ifstat(self):
        (ea, a), (eb, b), (ec, c), (ed, d) = self.operands(4)
        if self.rng.random() < 0.5:
            return [], f"({ec} if {ea}>{eb} else {ed})", c if a > b else d
        return [], f"({ec} if {ea}<{eb} else {ed})", c if a < b else d

    def compose(self, operations: tuple[str, ...]) -> tuple[str, int]:
        code: list[str] = []
        nesting = self.hardness()[1]
        for _ in range(nesting):
            lines, expr, value = getattr(self, f"op_{self.rng.choice(operations)}")()
            code += lines
            self.stack.append((expr, value))
        expr, value = self.stack.pop()
        return "\n".join([*code, f"print({expr})"]), value


def _hardness(rng: random.Random, length: int, nesting: int, mix: bool) -> Hardness:
    if mix:  # "mix": a fresh draw at every call, so every number has its own digit count
        return lambda: (rng.randint(1, length), rng.randint(1, nesting))
    return lambda: (length, nesting)


def make_program(rng: random.Random, variant: str, *, length: int, nesting: int, mix: bool,
                 operations: tuple[str, ...] | None = None) -> tuple[str, str]:
    """(program text, printed output) of one program-evaluation example."""
    hardness = _hardness(rng, length, nesting, mix)
    if variant == "addition":
        digits = hardness()[0]
        lo = 10 ** (digits - 1) if digits > 1 else 1
        a, b = rng.randint(lo, 10**digits - 1), rng.randint(lo, 10**digits - 1)
        text, expected = f"print({a}+{b})", a + b
    else:
        ops = tuple(operations or PROGRAM_VARIANTS[variant])
        text, expected = _Composer(rng, hardness).compose(ops)
    output = run_program(text)
    if output != str(expected):  # the interpreter and the generator's own bookkeeping must agree
        raise RuntimeError(f"LTE interpreter gave {output!r}, generator tracked {expected!r} for {text!r}")
    return text, output


def make_memorization(rng: random.Random, variant: str, *, length: int, mix: bool) -> tuple[str, str]:
    """(input, target) of one memorization example: the target is a number of up to ``length`` digits."""
    digits = rng.randint(1, length) if mix else length
    number = "".join([str(rng.randint(1, 9)), *(str(rng.randrange(10)) for _ in range(digits - 1))])
    if variant == "copy":
        return number, number
    if variant == "double":
        return number + number, number
    if variant == "reverse":
        return number[::-1], number
    raise DataError(f"unknown LTE memorization variant {variant!r}; valid: {', '.join(MEMORIZATION_VARIANTS)}")


def split_of(source: str, target: str) -> int:
    """0 (train), 1 (val) or 2 (test): a stable hash of the example text modulo 3 (Zaremba & Sutskever)."""
    return zlib.crc32(f"{source}\x00{target}".encode()) % 3


def generate(variant: str, split: int, size: int, *, length: int, nesting: int, mix: bool, seed: int,
             operations: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """``size`` examples of the given split (0 train, 1 val, 2 test), from their own seeded stream."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    tries = 0
    while len(out) < size:
        tries += 1
        if tries > 50 * size + 1000:
            raise DataError(f"LTE {variant}: could not draw {size} examples for split {split} with length "
                            f"{length}, nesting {nesting}; raise task.length")
        if variant in MEMORIZATION_VARIANTS:
            x, y = make_memorization(rng, variant, length=length, mix=mix)
        else:
            x, y = make_program(rng, variant, length=length, nesting=nesting, mix=mix, operations=operations)
        if split_of(x, y) == split:
            out.append((x, y))
    return out


@register_task_family("lte")
def load_lte(cfg: dict[str, Any], seed: int) -> TaskData:
    variant = cfg["variant"]
    valid = [*PROGRAM_VARIANTS, *MEMORIZATION_VARIANTS]
    if variant not in valid:
        raise DataError(f"task.variant={variant!r}; valid: {', '.join(valid)}")
    length, nesting = int(cfg["length"]), int(cfg["nesting"])
    if length < 1 or nesting < 1:
        raise DataError(f"task.length={length} and task.nesting={nesting} must be at least 1")
    if variant in PROGRAM_VARIANTS and length > 18:
        raise DataError(f"task.length={length}: program numbers have at most 18 digits here")
    operations = tuple(cfg.get("operations") or ()) or None
    if operations is not None:
        bad = [op for op in operations if op not in OPERATIONS]
        if bad:
            raise DataError(f"task.operations has {bad[0]!r}; valid: {', '.join(OPERATIONS)}")
    strategy = cfg["strategy"]
    if strategy not in ("mix", "baseline"):
        raise DataError(f"task.strategy={strategy!r}; valid: mix, baseline")
    data_seed = cfg.get("data_seed")
    base_seed = seed if data_seed is None else data_seed
    vocab = Vocab(list(CHARSET))
    raw = {}
    for stream, split in enumerate(("train", "val", "test")):
        mix = strategy == "mix" and split == "train"
        raw[split] = generate(variant, stream, int(cfg[f"{split}_size"]), length=length, nesting=nesting, mix=mix,
                              seed=base_seed * 1000 + stream, operations=operations)
    datasets = {split: PairDataset([(vocab.encode(list(x)), vocab.encode(list(y))) for x, y in items])
                for split, items in raw.items()}
    longest_src = max(len(x) for items in raw.values() for x, _ in items)
    longest_tgt = max(len(y) for items in raw.values() for _, y in items)
    kind = "memorization" if variant in MEMORIZATION_VARIANTS else "program evaluation"
    knobs = f"length {length}" + (f", nesting {nesting}" if kind == "program evaluation" else "")
    return symbol_seq2seq_task(
        vocab,
        datasets,
        max_len=max(longest_src, longest_tgt) + 2,
        eval_splits={"test": "test"},
        metric_flavours={
            "char_acc": "greedy decoding; fraction of target characters right at their position",
            "seq_acc": "greedy decoding; fraction of outputs exactly equal to the target",
            "data": f"Learning to Execute {kind}, {variant}, {knobs}; train: "
                    + ("'mix' strategy (lengths/nesting drawn up to the maximum, no curriculum)"
                       if strategy == "mix" else "'baseline' strategy (always the maximum)")
                    + "; val/test at the maximum; splits disjoint by text hash mod 3"
                    + ("; 'control' = if-expressions and for-loops only (our reading of the UT paper)"
                       if variant == "control" and operations is None else ""),
        },
        train_lengths=[len(x) + 1 for x, _ in datasets["train"].pairs],
        detokenize=lambda ids: "".join(vocab.decode(ids)),
        description=f"LTE {variant} ({knobs}, {strategy}), train {len(raw['train'])}, val {len(raw['val'])}, "
                    f"test {len(raw['test'])}, generated from seed {base_seed}",
    )
