"""Kill `python -m repro run` with a real signal at a random moment, rerun, compare records.

The harness promise: an interrupted and resumed sweep leaves records byte-identical
to an uninterrupted one, losing and duplicating nothing. The self-test registry's points sleep,
so a kill lands mid-sweep (the test checks that it did, at least once).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness_selftest import REGISTRY, fixture_env

REPO = Path(__file__).resolve().parents[1]
NAMES = ("selftest-a", "selftest-b")


def repro_cmd(results: Path, *extra: str, registry: str = REGISTRY) -> list[str]:
    return [sys.executable, "-m", "repro", "run", "all", "--registry", registry, "--wandb",
            "disabled", "--no-progress", "--results-dir", str(results), *extra]


def run_to_end(cmd: list[str]) -> None:
    done = subprocess.run(cmd, cwd=REPO, env=fixture_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def csv_bytes(results: Path, names: tuple[str, ...] = NAMES) -> dict[str, bytes]:
    return {n: (results / n / "records.csv").read_bytes() for n in names}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    results = tmp_path_factory.mktemp("reference")
    run_to_end(repro_cmd(results, "--jobs", "2"))
    return csv_bytes(results)


def clean_env() -> dict[str, str]:
    """What a shell would hand the run: PATH, HOME and the registry's PYTHONPATH, not the test
    process's whole environment (the full suite's process, once other tests had run, left the
    SIGTERM case's runs uninterruptible, return code 0 on all six attempts)."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, "PYTHONPATH": fixture_env()["PYTHONPATH"]}


def default_signals() -> None:
    """In the child before exec: default dispositions and an empty mask, as a fresh login."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def wait_for_first_record(results: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if any((results / n / "records.csv").exists() for n in NAMES):
            return
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_killed_sweep_resumes_to_identical_records(tmp_path: Path, reference: dict[str, bytes],
                                                   sig: signal.Signals) -> None:
    rng = random.Random(f"{sig}-{os.getpid()}")
    interrupted_mid_sweep = 0
    seen: list = []
    # At least 3 attempts; up to 6 until one kill has landed mid-sweep (on a loaded machine
    # a pooled sweep's last 2 s can pass before the random moment comes).
    for attempt in range(6):
        if attempt >= 3 and interrupted_mid_sweep:
            break
        results = tmp_path / f"attempt{attempt}"
        cmd = repro_cmd(results, "--jobs", "2")
        # Python start-up plus pool start is ~1 s here; the sweeps take ~2 s after that.
        # Slower points (0.25 s each, about 6 s of sweep) so the kill lands inside it even
        # when the first record shows up late on a loaded machine.
        proc = subprocess.Popen(cmd, cwd=REPO, env={**clean_env(), "SELFTEST_SLEEP_S": "0.25"},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=default_signals)
        # Wait for the first finished point, then a random moment inside the sweep: a fixed
        # sleep raced machine load (too early on a busy machine, too late on an idle one).
        wait_for_first_record(results, proc)
        time.sleep(rng.uniform(0.0, 0.2))
        if proc.poll() is None:
            if sig == signal.SIGKILL:
                os.killpg(proc.pid, sig)  # the whole tree dies, as with an OOM kill or a reboot
            else:
                proc.send_signal(sig)
        proc.wait(timeout=60)
        stored = {n: (results / n / "records.csv").read_bytes()
                  if (results / n / "records.csv").exists() else b"" for n in NAMES}
        if stored != reference:
            interrupted_mid_sweep += 1
        seen.append((proc.returncode, {n: len(b) for n, b in stored.items()}))
        # 130: the harness caught the interrupt; -sig: it arrived before the handler existed.
        assert proc.returncode in (0, 130, -sig), proc.stderr.read().decode()
        run_to_end(cmd)
        assert csv_bytes(results) == reference
        # A third run finds everything done and changes nothing.
        run_to_end(cmd)
        assert csv_bytes(results) == reference
    assert interrupted_mid_sweep >= 1, (
        f"no kill landed mid-sweep; the test proved nothing (return code and stored bytes per "
        f"attempt: {seen}; reference {[len(b) for b in reference.values()]})")


def test_sigterm_stops_a_run_whose_parent_blocked_it(tmp_path: Path) -> None:
    """A blocked signal mask survives exec: a parent that blocks SIGTERM (the full test
    suite's process did, once some test had run) must not make `repro run` deaf to it."""
    cmd = repro_cmd(tmp_path / "blocked", "--jobs", "2")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        proc = subprocess.Popen(cmd, cwd=REPO, env=fixture_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    wait_for_first_record(tmp_path / "blocked", proc)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode in (130, -signal.SIGTERM), proc.stderr.read().decode()


def test_real_experiments_resume_after_sigkill(tmp_path: Path) -> None:
    """Same promise on real analytic experiments, killed by SIGKILL and resumed with --jobs 1."""
    names = ("slimpipe-max-context", "slimpipe-memory-vs-pp")
    ref = tmp_path / "ref"
    cmd = [sys.executable, "-m", "repro", "run", *names, "--wandb", "disabled", "--no-progress"]
    run_to_end([*cmd, "--jobs", "2", "--results-dir", str(ref)])
    killed = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--jobs", "2", "--results-dir", str(killed)], cwd=REPO, env=fixture_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(random.Random(7).uniform(0.3, 1.5))
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    run_to_end([*cmd, "--jobs", "1", "--results-dir", str(killed)])
    assert csv_bytes(killed, names) == csv_bytes(ref, names)


def _children(pid: int) -> set[int]:
    """Live (not zombie) processes whose parent is ``pid``, read from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.add(int(entry.name))
    return found


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_pool_workers_die_when_the_parent_is_sigkilled(tmp_path: Path) -> None:
    # Only the parent is killed (not its process group): the workers must notice on their own.
    proc = subprocess.Popen(repro_cmd(tmp_path, "--jobs", "2"), cwd=REPO, env=fixture_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and len(workers) < 2:
        workers = _children(proc.pid)
        time.sleep(0.02)
    assert len(workers) >= 2, "the pool never started two workers"
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(w) for w in workers):
            time.sleep(0.05)
        survivors = [w for w in workers if _running(w)]
        assert survivors == [], f"workers {survivors} outlived their parent"
    finally:
        for w in workers:
            if _running(w):
                os.kill(w, signal.SIGKILL)


def test_one_pool_across_experiments_writes_the_sequential_bytes(tmp_path: Path) -> None:
    """`run all --jobs 2` puts the points of three experiments (one with cost hints, so its
    points interleave with the others') in one pool: the records are byte-identical to
    `--jobs 1`, which runs the experiments one after another, and each experiment still gets
    its own summary line."""
    from harness_selftest_pool import EXPERIMENTS as POOL_NAMES
    from harness_selftest_pool import REGISTRY as POOL_REGISTRY

    names = tuple(POOL_NAMES)
    stderr = {}
    for jobs in ("1", "2"):
        done = subprocess.run(repro_cmd(tmp_path / jobs, "--jobs", jobs, registry=POOL_REGISTRY),
                              cwd=REPO, env=fixture_env(), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        stderr[jobs] = done.stderr
    assert csv_bytes(tmp_path / "1", names) == csv_bytes(tmp_path / "2", names)
    for name in names:
        assert f"{name}: 24 run, 0 already done, 24 points" in stderr["2"]


def test_pooled_failures_are_reported_per_point_and_the_rest_is_stored(tmp_path: Path) -> None:
    from harness_selftest_fail import FAILING
    from harness_selftest_fail import REGISTRY as FAIL_REGISTRY

    cmd = repro_cmd(tmp_path, "--jobs", "2", registry=FAIL_REGISTRY)
    done = subprocess.run(cmd, cwd=REPO, env=fixture_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    failed = [line for line in done.stderr.splitlines()
              if line.startswith("selftest-flaky: point failed: RuntimeError: flaky point")]
    assert len(failed) == len(FAILING) == 5
    assert "selftest-flaky: 19 run, 0 already done, 24 points" in done.stderr
    assert "selftest-a: 24 run, 0 already done, 24 points" in done.stderr
    # The failed points are retried by the next run, and only they.
    again = subprocess.run(cmd, cwd=REPO, env=fixture_env(), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 1
    assert "selftest-flaky: 0 run, 19 already done, 24 points" in again.stderr
    assert "selftest-a: 0 run, 24 already done, 24 points" in again.stderr


def test_interrupted_pool_across_experiments_resumes_to_sequential_bytes(tmp_path: Path) -> None:
    """SIGINT while three experiments' points share the pool (cost hints interleave them),
    then a rerun: the records equal a `--jobs 1` run's."""
    from harness_selftest_pool import EXPERIMENTS as POOL_NAMES
    from harness_selftest_pool import REGISTRY as POOL_REGISTRY

    names = tuple(POOL_NAMES)
    run_to_end(repro_cmd(tmp_path / "ref", "--jobs", "1", registry=POOL_REGISTRY))
    cmd = repro_cmd(tmp_path / "pool", "--jobs", "2", registry=POOL_REGISTRY)
    proc = subprocess.Popen(cmd, cwd=REPO, env=fixture_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and not any(
            (tmp_path / "pool" / n / "records.csv").exists() for n in names):
        time.sleep(0.02)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    stderr = proc.stderr.read().decode()
    assert proc.returncode in (0, 130), stderr
    if proc.returncode == 130:
        assert "finished points are stored" in stderr
    run_to_end(cmd)
    assert csv_bytes(tmp_path / "pool", names) == csv_bytes(tmp_path / "ref", names)
