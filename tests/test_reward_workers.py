"""The reward worker processes' lifetime (issue 25 items 4.11-4.13): what a reward function forks ends
with the run, Ctrl-C is the trainer's alone, a reward raising KeyboardInterrupt is one counted error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from pathlib import Path

import pytest

from rlvr.rewards import Scorer

sys.path.insert(0, str(Path(__file__).parent))
from reward_worker_tasks import InterruptingTask  # noqa: E402
from test_rewards import make_batch  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = str(Path(__file__).resolve().parent)


def _marked_processes(marker: str) -> list[int]:
    """Pids of live (not zombie) processes whose environment holds ``RLVR_TEST_MARKER=marker``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"RLVR_TEST_MARKER={marker}".encode() not in (d / "environ").read_bytes():
                continue
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            pids.append(int(d.name))
    return pids


def _script(body: str) -> list[str]:
    prelude = f"import sys; sys.path[:0] = [{SRC!r}, {TESTS!r}]\n"
    return [sys.executable, "-c", prelude + textwrap.dedent(body)]


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="counts processes through /proc")
def test_children_of_a_forking_reward_fn_end_with_the_run():
    """Item 4.11: the reward function's children (and with them the fork server and the resource
    tracker, which they kept alive) were still running after the trainer exited."""
    marker = uuid.uuid4().hex
    body = """
        from reward_worker_tasks import ForkingTask, items
        from rlvr.rewards import VerifierPool
        if __name__ == "__main__":
            got = VerifierPool(ForkingTask(), 1, 20).run(items(["a-0", "a-1", "a-2"]))
            assert [r[3] for r in got.values()] == [None] * 3, got
            print("scored", flush=True)
    """
    env = {**os.environ, "RLVR_TEST_MARKER": marker}
    proc = subprocess.run(_script(body), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "scored" in proc.stdout, proc.stderr
    left = _marked_processes(marker)
    for _ in range(20):  # the fork server and resource tracker exit on their own once nothing holds them
        if not left:
            break
        time.sleep(0.1)
        left = _marked_processes(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"{len(left)} processes of the run still alive after it exited"


def test_ctrl_c_is_the_parents_alone_no_worker_traceback():
    """Item 4.12: Ctrl-C (SIGINT to the terminal's process group) printed a traceback from the verifier
    worker; workers ignore SIGINT and only the parent reacts, once."""
    body = """
        from reward_worker_tasks import InterruptingTask, items
        from rlvr.rewards import VerifierPool
        if __name__ == "__main__":
            pool = VerifierPool(InterruptingTask(), 1, 60)
            pool.run(items(["ok-0"]))  # the worker is up
            print("scoring", flush=True)
            try:
                pool.run(items(["hang-0", "ok-1"]))
            except KeyboardInterrupt:
                print("parent interrupted", flush=True)
                sys.exit(130)
    """
    proc = subprocess.Popen(_script(body), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "scoring"
        time.sleep(1.0)  # the worker is inside the hung call
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert out.count("parent interrupted") == 1
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_reward_raising_keyboard_interrupt_is_one_warning_not_a_traceback_per_call(tok, capfd):
    """Item 4.12: a reward raising KeyboardInterrupt killed its worker on every call (one traceback
    each, 32 per round); now each call is a counted error and the round gives one warning."""
    sc = Scorer(InterruptingTask(), tok, timeout_s=20)
    try:
        capfd.readouterr()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            b = make_batch(tok, ["kbint-0", "ok-1", "exit-2", "kbint-3", "ok-4", "kbint-5"])
            st = sc.score(b)
        assert st.error_kinds == {"KeyboardInterrupt": 3, "SystemExit": 1} and st.timeouts == 0
        assert b.rewards.tolist() == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
        assert len([w for w in seen if "reward function failed" in str(w.message)]) == 1
        assert sc._pool.restarts == 0  # no worker died
        assert "Traceback" not in capfd.readouterr().err
    finally:
        sc.close()


@pytest.fixture(scope="module")
def tok():
    from rlvr.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def test_the_pools_float32_bound_is_torchs():
    """rlvr.rewards.pool imports no torch (fast worker start-up), so it spells float32's largest value."""
    import torch

    from rlvr.rewards.pool import FLOAT32_MAX
    from rlvr.rewards import REWARD_DTYPE

    assert FLOAT32_MAX == torch.finfo(REWARD_DTYPE).max


def test_resume_command_under_torchrun_includes_the_launcher():
    """Item 4.12: the resume command printed after Ctrl-C under torchrun lacked the launcher."""
    from rlvr.cli.train import _resume_command

    argv = ["train", "--config", "grpo", "--overwrite"]
    assert _resume_command(argv, {}) == "rlvr train --config grpo --resume"
    two = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert _resume_command(argv, two) == "torchrun --nproc_per_node 2 -m rlvr train --config grpo --resume"
    nodes = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert _resume_command(argv, nodes).startswith("torchrun --nproc_per_node 4 --nnodes 2 -m rlvr train")


def test_a_script_read_from_stdin_scores_in_workers_and_still_cuts_off_a_hung_call():
    """``python - < train.py`` (and a notebook) defines the task in a ``__main__`` that a forkserver child
    cannot rebuild (it opens ``<stdin>``): every worker used to exit while loading the task. The pool then
    forks instead; the timeout still cuts off a hung call, and the good calls keep their scores."""
    script = textwrap.dedent("""
        import time
        from rlvr.rewards.pool import VerifierPool, main_reimportable
        from rlvr.tasks.base import Verdict

        class StdinTask:
            name = "stdin"
            def verify(self, problem, text):
                if text == "hang":
                    time.sleep(60)
                return Verdict(score=float(len(text)), correct=True)

        pool = VerifierPool(StdinTask(), 2, 3.0)
        t0 = time.monotonic()
        out = pool.run([(0, {}, "ab"), (1, {}, "hang"), (2, {}, "abc")])
        pool.close()
        print("reimportable", main_reimportable(), "method", pool._ctx.get_start_method())
        print("scores", out[0][0], out[2][0], "hung", out[1][0], out[1][3][0])
        print("seconds", round(time.monotonic() - t0))
    """)
    proc = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": SRC}, cwd=TESTS)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["reimportable"] == "False method fork"
    assert lines["scores"] == "2.0 3.0 hung 0.0 Timeout"
    assert int(lines["seconds"]) < 30  # the 60 s call was cut off at the 3 s deadline


def test_hung_calls_past_the_spare_cap_cost_only_themselves(tok):
    """B20 (issue 37): with every worker and spare (1 + MIN_SPARE_WORKERS) stuck on a hung call, the
    calls still queued behind them scored 0 as timeouts although they were fine. Now each call has its
    own reward_timeout_s: the killed workers' slots take the queue, so only the 6 hung calls are lost,
    and the batch stays within BATCH_DEADLINE_FACTOR x reward_timeout_s (+ start-up)."""
    from reward_worker_tasks import ScriptedTask

    from rlvr.rewards.pool import BATCH_DEADLINE_FACTOR, MIN_SPARE_WORKERS

    t = 2.0
    sc = Scorer(ScriptedTask(hang_s=60), tok, timeout_s=t, num_workers=1)
    try:
        sc.score(make_batch(tok, ["ok-0"]))  # the worker is up: start-up is not timed
        hung = [f"hang-{i}" for i in range(1, MIN_SPARE_WORKERS + 3)]  # one more than workers + spares
        uids = ["ok-0", *hung, "bad-7", "ok-8"]
        b = make_batch(tok, uids)
        t0 = time.monotonic()
        with pytest.warns(UserWarning, match="reward_timeout_s"):
            st = sc.score(b)
        elapsed = time.monotonic() - t0
        assert (st.timeouts, st.errors, st.calls) == (len(hung), 0, len(uids))
        assert b.rewards.tolist() == [0.5] + [0.0] * len(hung) + [0.0, 0.5]
        assert b.feedback[-2:] == ["no", None]  # the calls after the hung ones were really scored
        assert elapsed < BATCH_DEADLINE_FACTOR * t + 5, elapsed
        assert len(sc._pool._workers) == 1
    finally:
        sc.close()
