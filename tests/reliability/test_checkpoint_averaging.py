"""Checkpoint averaging (fairseq's ``average_checkpoints``): the mean of the inputs' weights, fairseq's rule for
non-float buffers, one-line refusals that write nothing, and an averaged run evaluated by ``attnlab-eval``."""

from __future__ import annotations

import pytest
import torch

from attnlab.cli.average_checkpoints import main as average_main
from attnlab.training.checkpoint_averaging import AveragingError, average_weights, last_checkpoints
from tests.conftest import TINY, TINY_ALGO, train_cli
from tests.reliability.helpers import one_clear_line, run_cli


def _state(seed: int, counter: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.linear.weight": torch.randn(3, 4, generator=g),
        "model.linear.bias": torch.randn(4, generator=g),
        "model.half": torch.randn(5, generator=g).half(),
        "model.counter": torch.tensor([counter, 2 * counter], dtype=torch.int64),
        "model.mask": torch.tensor([True, counter > 1, False]),
    }


def _save(path, state, step):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "global_step": step, "optimizer_states": [{"state": {}}]}, path)
    return path


def test_the_average_of_two_checkpoints_is_the_mean_of_their_tensors(tmp_path, capsys):
    a, b = _state(1, counter=1), _state(2, counter=4)
    pa, pb = _save(tmp_path / "a.ckpt", a, 10), _save(tmp_path / "b.ckpt", b, 20)
    out = tmp_path / "avg.ckpt"
    average_main([str(pa), str(pb), "--out", str(out)])
    assert f"-> {out}" in capsys.readouterr().out
    written = torch.load(out, map_location="cpu", weights_only=True)
    avg = written["state_dict"]
    assert list(avg) == list(a)
    for key in ("model.linear.weight", "model.linear.bias"):
        torch.testing.assert_close(avg[key], (a[key] + b[key]) / 2, rtol=0, atol=1e-7)
    assert avg["model.half"].dtype == torch.float16  # summed in float32, kept in the checkpoint's dtype
    torch.testing.assert_close(avg["model.half"], ((a["model.half"].float() + b["model.half"].float()) / 2).half())
    # non-float buffers as fairseq: the sum floor-divided by N ((1 + 4) // 2 = 2, (2 + 8) // 2 = 5)
    assert avg["model.counter"].tolist() == [2, 5] and avg["model.counter"].dtype == torch.int64
    assert avg["model.mask"].tolist() == [True, False, False]  # a boolean is kept only where every input has it
    assert written["global_step"] == 20 and "optimizer_states" not in written
    assert [x["global_step"] for x in written["averaged_from"]] == [10, 20]


def test_equal_integer_buffers_are_kept_as_they_are():
    a, b = _state(1, counter=3), _state(2, counter=3)
    assert torch.equal(average_weights([a, b])["model.counter"], a["model.counter"])


@pytest.mark.parametrize("change", ["missing-key", "extra-key", "shape", "dtype"])
def test_checkpoints_of_different_models_are_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, change):
    a, b = _state(1, counter=1), _state(2, counter=1)
    if change == "missing-key":
        del b["model.linear.bias"]
    elif change == "extra-key":
        b["model.other"] = torch.zeros(2)
    elif change == "shape":
        b["model.linear.weight"] = torch.zeros(4, 3)
    else:
        b["model.linear.weight"] = b["model.linear.weight"].double()
    pa, pb = _save(tmp_path / "a.ckpt", a, 1), _save(tmp_path / "b.ckpt", b, 2)
    out = tmp_path / "avg.ckpt"
    code, err = run_cli(average_main, [str(pa), str(pb), "--out", str(out)], capsys)
    line = one_clear_line(err)
    assert code == 2 and "cannot average" in line and ("linear" in line or "other" in line), line
    assert not out.exists() and not list(tmp_path.glob("*.tmp-*"))


def _bad_input(kind, tmp_path):
    good = _save(tmp_path / "run" / "checkpoints" / "step0000002.ckpt", _state(1, 1), 2)
    other = _save(tmp_path / "b.ckpt", _state(2, 1), 4)
    run = tmp_path / "run"
    return {
        "one-file": [str(good), "--out", str(tmp_path / "avg.ckpt")],
        "no-out": [str(good), str(other)],
        "into-checkpoints": [str(good), str(other), "--out", str(run / "checkpoints" / "avg.ckpt")],
        "output-is-an-input": [str(good), str(other), "--out", str(other)],
        "twice": [str(other), str(other), "--out", str(tmp_path / "avg.ckpt")],
        "missing-file": [str(good), str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "avg.ckpt")],
        "not-a-checkpoint": [str(good), str(_write(tmp_path / "junk.ckpt")), "--out", str(tmp_path / "avg.ckpt")],
        "too-few": [str(run), "--last", "3"],
        "last-zero": [str(run), "--last", "0"],
        "last-two-folders": [str(run), str(tmp_path), "--last", "2"],
        "last-not-a-folder": [str(good), "--last", "2"],
        "bad-option": [str(good), "--lats", "2"],
    }[kind]


def _write(path):
    path.write_bytes(b"not a checkpoint")
    return path


@pytest.mark.parametrize("kind", ["one-file", "no-out", "into-checkpoints", "output-is-an-input", "twice",
                                  "missing-file", "not-a-checkpoint", "too-few", "last-zero", "last-two-folders",
                                  "last-not-a-folder", "bad-option"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(kind, tmp_path, capsys):
    argv = _bad_input(kind, tmp_path)
    before = sorted(p for p in tmp_path.rglob("*"))
    code, err = run_cli(average_main, argv, capsys)
    assert code == 2, err
    one_clear_line(err)
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_last_n_takes_the_highest_steps_and_last_ckpt_where_its_step_has_no_file(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        _save(ckpts / f"step{step:07d}.ckpt", _state(step, 1), step)
    _save(ckpts / "last.ckpt", _state(8, 1), 8)  # a final save after the last validation
    (ckpts / "step0000010.ckpt.tmp-123").write_bytes(b"partial")
    assert [p.name for p in last_checkpoints(tmp_path, 3)] == ["step0000004.ckpt", "step0000006.ckpt", "last.ckpt"]
    _save(ckpts / "step0000008.ckpt", _state(8, 1), 8)  # last.ckpt's step has its own file now: that file counts
    assert [p.name for p in last_checkpoints(tmp_path / "checkpoints", 2)] == ["step0000006.ckpt", "step0000008.ckpt"]
    with pytest.raises(AveragingError, match="4 steps .*5 are needed.*save_top_k=-1"):
        last_checkpoints(tmp_path, 5)


def test_an_averaged_checkpoint_of_a_real_run_is_evaluated_by_attnlab_eval(trained_run, capsys):
    """The session's tiny trained run (its best step file and last.ckpt): averaged, then tested from the run."""
    import json

    from attnlab.cli.evaluate import main as eval_main

    (best,) = (trained_run / "checkpoints").glob("step*.ckpt")
    last = trained_run / "checkpoints" / "last.ckpt"
    averaged = trained_run / "averaged_best_last.ckpt"
    average_main([str(best), str(last), "--out", str(averaged)])
    states = [torch.load(p, weights_only=True)["state_dict"] for p in (best, last, averaged)]
    for key, value in states[2].items():
        if value.is_floating_point():
            torch.testing.assert_close(value, (states[0][key] + states[1][key]) / 2)
    capsys.readouterr()
    eval_main([str(averaged)])
    assert "written:" in capsys.readouterr().out
    result = json.loads((trained_run / "averaged_best_last.eval.json").read_text())
    assert result["step"] == 4 and "test/seq_acc" in result["metrics"]


@pytest.mark.slow
def test_a_run_averaged_over_its_last_checkpoints_is_evaluated_by_attnlab_eval(tmp_path, capsys):
    """A real tiny run keeping every validation's checkpoint; its last two averaged, then tested."""
    import json

    from attnlab.cli.evaluate import main as eval_main

    run_dir = tmp_path / "run"
    train_cli(tmp_path, [*TINY, *TINY_ALGO, "logger=csv", "seed=5", "callbacks.checkpoint.save_top_k=-1",
                         f"hydra.run.dir={run_dir}"])
    capsys.readouterr()
    average_main([str(run_dir), "--last", "2"])
    averaged = run_dir / "averaged_last2.ckpt"
    assert "steps 2, 4" in capsys.readouterr().out
    step2, step4 = (torch.load(run_dir / "checkpoints" / f"step000000{s}.ckpt", weights_only=True)["state_dict"]
                    for s in (2, 4))
    avg = torch.load(averaged, weights_only=True)["state_dict"]
    key = next(k for k, v in step4.items() if v.is_floating_point() and not torch.equal(v, step2[k]))
    torch.testing.assert_close(avg[key], (step2[key] + step4[key]) / 2)
    eval_main([str(averaged)])
    result = json.loads((run_dir / "averaged_last2.eval.json").read_text())
    assert result["step"] == 4 and "test/seq_acc" in result["metrics"]
