"""Learning to Execute: the interpreter agrees with Python, generated programs are right, seeded and sized."""

from __future__ import annotations

import ast
import random
import re

import pytest

from attnlab.tasks import DataError, build_task
from attnlab.tasks.lte import ProgramError, generate, make_memorization, make_program, run_program, split_of

LTE = dict(name="lte/program", family="lte", loader="lte", variant="program", length=3, nesting=2,
           strategy="mix", train_size=60, val_size=20, test_size=20, data_seed=None)


# -- the interpreter against the same computations written directly in Python ----------------------------
def test_interpreter_matches_python_on_hand_built_programs():
    a = 12
    for _ in range(3):
        a += 4
    assert run_program("a=12\nfor x in range(3):a+=4\nprint(a)") == str(a)

    b = 705
    c = b - 88
    assert run_program("b=705;\nprint((b-88))") == str(c)

    d = 9
    for _ in range(7):
        d -= 31 * 2
    assert run_program("d=9\nfor x in range(7):d-=(31*2)\nprint(d)") == str(d)

    assert run_program("print((5 if 3>7 else (2*11)))") == str(5 if 3 > 7 else 2 * 11)
    assert run_program("print(((3-40) if 1<2 else 6))") == str((3 - 40) if 1 < 2 else 6)
    assert run_program("print(398345+425098)") == str(398345 + 425098)
    assert run_program("print(2+3*4-(1-5)*2)") == str(2 + 3 * 4 - (1 - 5) * 2)  # precedence as Python
    assert run_program("print(-3*-2)") == str(-3 * -2)
    # a conditional's else branch may itself be a conditional (right-nested, as in Python)
    assert run_program("print(1 if 2>3 else 4 if 5>6 else 7)") == str(1 if 2 > 3 else 4 if 5 > 6 else 7)
    e = 3
    f = e + 10
    for x in range(4):
        f += x
    assert run_program("e=3\nf=(e+10)\nfor x in range(4):f+=x\nprint(f)") == str(f)


@pytest.mark.parametrize("text,match", [
    ("print(y)", "'y' is not defined"),
    ("a=1\nprint(a", "expected \\)"),
    ("a=1 2\nprint(a)", "line 1: unexpected"),
    ("print(3$4)", "cannot read"),
    ("for x in range(2000000):a=1\nprint(a)", "not a small integer"),
])
def test_interpreter_rejects_bad_programs_with_the_line(text, match):
    with pytest.raises(ProgramError, match=match):
        run_program(text)


def _python_value(text: str) -> str:
    """An independent check: Python's own parser (``ast.parse``, nothing executed) and a tiny tree walker."""
    env: dict[str, int] = {}
    out: list[str] = []
    binops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y}
    cmps = {ast.Lt: lambda x, y: x < y, ast.Gt: lambda x, y: x > y}

    def value(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.BinOp):
            return binops[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.IfExp):
            return value(node.body) if value(node.test) else value(node.orelse)
        if isinstance(node, ast.Compare):
            return cmps[type(node.ops[0])](value(node.left), value(node.comparators[0]))
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    def run(stmts):
        for s in stmts:
            if isinstance(s, ast.Assign):
                env[s.targets[0].id] = value(s.value)
            elif isinstance(s, ast.AugAssign):
                env[s.target.id] = binops[type(s.op)](env[s.target.id], value(s.value))
            elif isinstance(s, ast.For):
                for k in range(value(s.iter.args[0])):
                    env[s.target.id] = k
                    run(s.body)
            elif isinstance(s, ast.Expr) and s.value.func.id == "print":
                out.append(str(value(s.value.args[0])))
            else:
                raise AssertionError(f"unexpected statement {ast.dump(s)}")

    run(ast.parse(text).body)
    return "\n".join(out)


@pytest.mark.parametrize("variant", ["program", "control", "addition"])
@pytest.mark.parametrize("mix", [True, False])
def test_generated_programs_are_python_with_the_same_output(variant, mix):
    rng = random.Random(7)
    for _ in range(150):
        text, output = make_program(rng, variant, length=4, nesting=3, mix=mix)
        assert _python_value(text) == output, text


def test_program_nesting_and_length_are_respected():
    # With only (a+b)/(a-b), a program of nesting n has exactly n operators and n+1 numbers.
    rng = random.Random(1)
    for mix in (False, True):
        for _ in range(100):
            text, _ = make_program(rng, "program", length=4, nesting=3, mix=mix, operations=("pair",))
            ops = len(re.findall(r"[+-]", text))
            numbers = re.findall(r"\d+", text)
            assert ops == 3 if not mix else 1 <= ops <= 3
            assert len(numbers) == ops + 1
            assert all(len(n) <= 4 for n in numbers)
    # at the target hardness (val / test) every number has at most `length` digits and some have exactly that
    literals = [n for _ in range(50) for n in re.findall(r"\d+", make_program(
        rng, "program", length=4, nesting=2, mix=False, operations=("pair", "ifstat"))[0])]
    assert max(len(n) for n in literals) == 4 and all(len(n) <= 4 for n in literals)
    # addition: two numbers of exactly `length` digits
    for _ in range(50):
        text, out = make_program(rng, "addition", length=5, nesting=2, mix=False)
        a, b = map(int, re.findall(r"\d+", text))
        assert len(str(a)) == len(str(b)) == 5 and out == str(a + b)


def test_control_uses_only_control_flow():
    rng = random.Random(3)
    for _ in range(100):
        text, _ = make_program(rng, "control", length=3, nesting=2, mix=False)
        assert " if " in text or "for x in range" in text


@pytest.mark.parametrize("variant", ["copy", "double", "reverse"])
def test_memorization_variants(variant):
    rng = random.Random(0)
    for mix in (True, False):
        for _ in range(100):
            x, y = make_memorization(rng, variant, length=55, mix=mix)
            assert y.isdigit() and y[0] != "0" and (len(y) <= 55 if mix else len(y) == 55)
            assert x == {"copy": y, "double": y + y, "reverse": y[::-1]}[variant]


def test_splits_are_disjoint_seeded_and_sized():
    task = build_task(LTE, seed=5)
    assert task.kind == "seq2seq" and set(task.datasets) == {"train", "val", "test"}
    assert [len(task.datasets[s]) for s in ("train", "val", "test")] == [60, 20, 20]
    texts = {s: {tuple(x) for x, _ in task.datasets[s].pairs} for s in task.datasets}
    assert not texts["train"] & texts["test"] and not texts["train"] & texts["val"]
    assert task.datasets["train"].pairs == build_task(LTE, seed=5).datasets["train"].pairs
    assert task.datasets["train"].pairs != build_task(LTE, seed=6).datasets["train"].pairs
    fixed = {**LTE, "data_seed": 0}
    assert build_task(fixed, seed=1).datasets["test"].pairs == build_task(fixed, seed=2).datasets["test"].pairs
    # every example decodes back to a program whose interpreter output is its target
    for x, y in task.datasets["test"].pairs:
        assert run_program(task.detokenize(x)) == task.detokenize(y)
    for split, number in (("train", 0), ("val", 1), ("test", 2)):
        for x, y in task.datasets[split].pairs[:10]:
            assert split_of(task.detokenize(x), task.detokenize(y)) == number
    assert generate("copy", 2, 5, length=10, nesting=1, mix=False, seed=3) == \
        generate("copy", 2, 5, length=10, nesting=1, mix=False, seed=3)


def test_memorization_task_through_the_config():
    from omegaconf import OmegaConf

    from tests.conftest import compose

    cfg = OmegaConf.to_container(compose(["task=lte/memorization", "task.variant=reverse",
                                          "task.at_scale.cpu.train_size=30", "task.at_scale.cpu.val_size=5",
                                          "task.at_scale.cpu.test_size=5"]).task, resolve=True)
    task = build_task(cfg, seed=0)
    for x, y in task.datasets["test"].pairs:
        src, tgt = task.detokenize(x), task.detokenize(y)
        assert len(tgt) == 55 and src == tgt[::-1]
    assert task.max_len >= 57
    batch = task.collate([task.datasets["train"][i] for i in range(4)])
    assert (batch["tgt_in"][:, 0] == task.bos_id).all()


def test_bad_lte_config_is_refused():
    with pytest.raises(DataError, match="valid: program, control, addition, copy, double, reverse"):
        build_task({**LTE, "variant": "sort"}, seed=0)
    with pytest.raises(DataError, match="task.operations has 'while'"):
        build_task({**LTE, "operations": ["pair", "while"]}, seed=0)
    with pytest.raises(DataError, match="valid: mix, baseline"):
        build_task({**LTE, "strategy": "curriculum"}, seed=0)


@pytest.mark.slow  # a real (tiny) training run: ~15 s on two shared cores
def test_lte_trains_a_few_steps_and_reports_char_and_seq_accuracy(tmp_path):
    from attnlab.training.run import run
    from tests.conftest import TINY, compose

    cfg = compose([*TINY, "debug=fdr", "task=lte/program", "task.at_scale.cpu.train_size=32",
                   "task.at_scale.cpu.val_size=4", "task.at_scale.cpu.test_size=4", "task.decoding.max_len_b=4"],
                  run_dir=tmp_path / "run")
    record = run(cfg, run_dir=tmp_path / "run", command="pytest")
    assert record["status"] == "completed"
    final = record["metrics"]["final"]
    assert "test/char_acc" in final and "test/seq_acc" in final
    assert "mix" in record["metric_flavours"]["data"]
