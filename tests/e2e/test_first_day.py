"""The first-day walk of docs/miner.md ("Your first day"), run as written: the blocks marked
`<!-- first-day: step N -->` are read from the doc itself and sent, in order, to one bash shell in
an empty folder, with `pot` the entry point of this interpreter's environment. A tiny
transformers Llama is built with random weights and imported (`pot model import --from
hf-llama`), fine-tuned on a dev chain (`pot chain dev`) that one verifier node (`pot node run`)
follows; both of the run's challenges must resolve honest, the node must stop on SIGTERM within
3 s and be ready again after a restart. A command that fails, or an output that differs from the
one the doc shows (`…` standing for what differs between runs), fails the walk.

The quick tests check the doc's walk without running it: its steps are numbered 1..N, each shown
output follows a step, the walk holds the commands the issue names, and docs/operator.md points
to it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "miner.md"
SECTION = "## Your first day"
BIN = Path(sys.executable).parent  # this environment's `pot` and `python`
DOC_PORTS = ("8700", "8760")  # the node's API and the miner's prover, as the doc writes them
STEP_TIMEOUT_S = 180.0
TRAIN_TIMEOUT_S = 420.0  # training and both challenges' windows, on a loaded machine
STOP_LIMIT_S = 3.0  # the issue's bound on a SIGTERM stop

_BLOCK = re.compile(r"<!-- first-day: (step (\d+)|output) -->\n```(\w*)\n(.*?)\n```", re.S)


@dataclass
class Step:
    number: int
    script: str
    output: str | None = None  # the stdout the doc shows, if it shows one


def walk_steps(text: str) -> list[Step]:
    """The marked blocks of the doc's walk section, in order; refuses a walk whose steps are not
    numbered 1..N or whose shown output follows no step."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    body = text[start:end if end >= 0 else len(text)]
    steps: list[Step] = []
    for m in _BLOCK.finditer(body):
        if m.group(2) is not None:
            if m.group(3) not in ("sh", "bash"):
                raise ValueError(f"first-day step {m.group(2)} is a {m.group(3) or 'plain'} block, not sh")
            steps.append(Step(int(m.group(2)), m.group(4)))
        else:
            if not steps or steps[-1].output is not None:
                raise ValueError(f"a first-day output block follows no step (after step "
                                 f"{steps[-1].number if steps else 0})")
            steps[-1].output = m.group(4)
    if len(re.findall(r"^<!-- first-day:", body, re.M)) != len(_BLOCK.findall(body)):
        raise ValueError("a first-day marker is not followed by a fenced block")
    numbers = [s.number for s in steps]
    if numbers != list(range(1, len(steps) + 1)):
        raise ValueError(f"first-day steps must be numbered 1..N in order, got {numbers}")
    return steps


def output_problems(shown: str, printed: str) -> list[str]:
    """Line-by-line differences between the output a doc shows and what was printed; `…` in a
    shown line stands for any text."""
    want = shown.strip("\n").splitlines()
    got = printed.rstrip("\n").splitlines()
    problems = []
    for i, w in enumerate(want):
        g = got[i] if i < len(got) else None
        pattern = ".*?".join(re.escape(part) for part in w.rstrip().split("…"))
        if g is None or not re.fullmatch(pattern, g.rstrip()):
            problems.append(f"line {i + 1}: the doc shows {w!r}, the command printed {g!r}")
    if len(got) > len(want):
        problems.append(f"the command printed {len(got) - len(want)} more line(s): {got[len(want):]!r}")
    return problems


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Ran:
    stdout: str
    stderr: str
    seconds: float
    failed: list[str]  # the commands that failed, with their status


class Shell:
    """One bash process, in its own session, fed one step at a time. Each step is sourced in the
    shell itself (its background jobs, `%1` and `%2`, live there), its stdout and stderr go to files,
    and an ERR trap records every command that fails."""

    def __init__(self, workdir: Path, scratch: Path, env: dict[str, str]) -> None:
        self.scratch = scratch
        self.fails = scratch / "failed"
        self.log = open(scratch / "shell.log", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], stdin=subprocess.PIPE,
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir, env=env,
                                     text=True, start_new_session=True)
        self._send(f"set -o pipefail\ntrap 'echo \"status $?: $BASH_COMMAND\" >> {self.fails}' ERR\n")

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def run(self, n: int, script: str, timeout: float) -> Ran:
        path, out, err, rc = (self.scratch / f"step-{n}.{ext}" for ext in ("sh", "out", "err", "rc"))
        path.write_text(script + "\n")
        before = self.fails.read_text().splitlines() if self.fails.exists() else []
        t0 = time.monotonic()
        self._send(f"{{ source {path} ; }} > {out} 2> {err} < /dev/null; echo $? > {rc}.part; mv {rc}.part {rc}\n")
        while not rc.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"step {n}: the shell exited ({self.proc.returncode})\n{self._tails(out, err)}")
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"step {n} did not finish within {timeout:.0f} s\n{script}\n{self._tails(out, err)}")
            time.sleep(0.05)
        seconds = time.monotonic() - t0
        after = self.fails.read_text().splitlines() if self.fails.exists() else []
        # `source` itself fails when the step's last command did: that is the same failure.
        failed = [f for f in after[len(before):] if not f.endswith(f"source {path}")]
        return Ran(out.read_text(errors="replace"), err.read_text(errors="replace"), seconds, failed)

    @staticmethod
    def _tails(out: Path, err: Path) -> str:
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}\n" for p in (out, err) if p.exists())

    def close(self) -> None:
        """Ends the shell and everything it started (one process group: a non-interactive bash
        keeps its background jobs in its own group)."""
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
        self.proc.wait(timeout=10)
        self.log.close()


def _doc_steps() -> list[Step]:
    return walk_steps(DOC.read_text())


# --- the doc's walk, checked without running it -------------------------------------------------

def test_the_walk_is_numbered_and_holds_the_issues_commands():
    steps = _doc_steps()
    script = "\n".join(s.script for s in steps)
    for command in ("pot chain dev --db chain.db --interval 1", "pot node run --config node.toml",
                    "pot model import --from hf-llama", "save_pretrained", "pot miner train --spec finetune.toml "
                    "--init init.safetensors", "pot chain events", "kill %2", "readyz"):
        assert command in script, command
    # The node is started, stopped with SIGTERM, started again and stopped, in that order.
    kinds = [("start" if "pot node run" in s.script else "stop") for s in steps
             if "pot node run" in s.script or "kill %2" in s.script]
    assert kinds == ["start", "stop", "start", "stop"]
    shown = [s for s in steps if s.output is not None]
    assert any("verdict=honest" in s.output for s in shown)
    # Every port the walk uses is one the test replaces: none of its own would collide.
    ports = set(re.findall(r"(?<![\d.])(8\d{3})(?!\d)", script))
    assert ports == set(DOC_PORTS), ports


def test_operator_md_points_to_the_walk():
    text = (REPO / "docs" / "operator.md").read_text()
    assert '"Your first day"' in text and "docs/miner.md" in text


def test_the_walk_reader_refuses_a_broken_walk():
    text = DOC.read_text()
    with pytest.raises(ValueError, match="numbered 1..N"):
        walk_steps(text.replace("<!-- first-day: step 2 -->", "<!-- first-day: step 3 -->", 1))
    with pytest.raises(ValueError, match="follows no step"):
        walk_steps(text.replace("<!-- first-day: step 2 -->", "<!-- first-day: output -->", 1))
    with pytest.raises(ValueError, match="not followed by a fenced block"):
        walk_steps(text.replace("<!-- first-day: step 2 -->\n```sh", "<!-- first-day: step 2 -->\n\n```sh", 1))


def test_outputs_match_with_placeholders_and_differences_are_named():
    assert output_problems("run …: 8 steps, root …\nchallenge …: honest\n",
                           "run 4a7f: 8 steps, root a66b\nchallenge 933c: honest\n") == []
    assert output_problems("challenge …: honest", "challenge 933c: fraud") == [
        "line 1: the doc shows 'challenge …: honest', the command printed 'challenge 933c: fraud'"]
    assert output_problems("a\nb", "a") == ["line 2: the doc shows 'b', the command printed None"]
    assert output_problems("a", "a\nb") == ["the command printed 1 more line(s): ['b']"]
    assert output_problems("x (…)", "x (1) y") != []  # a placeholder never hides text after it


# --- the walk itself ------------------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.slow
def test_first_day_walk(tmp_path):
    pytest.importorskip("transformers")  # step 1 builds the checkpoint with it
    assert (BIN / "pot").exists() and shutil.which("curl"), "the walk needs this environment's pot and curl"
    steps = _doc_steps()
    ports = {doc: str(_free_port()) for doc in DOC_PORTS}

    def local(text: str) -> str:
        for doc, free in ports.items():
            text = re.sub(rf"(?<![\d.]){doc}(?!\d)", free, text)
        return text

    day, scratch = tmp_path / "day", tmp_path / "shell"
    day.mkdir()
    scratch.mkdir()
    # A person's shell: this environment first on the PATH, no node setting left in the environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("POT_") and k != "PYTHONPATH"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    shell = Shell(day, scratch, env)
    timings = {}
    try:
        for step in steps:
            script = local(step.script)
            timeout = TRAIN_TIMEOUT_S if "pot miner train" in script else STEP_TIMEOUT_S
            ran = shell.run(step.number, script, timeout)
            timings[step.number] = round(ran.seconds, 2)
            context = (f"step {step.number}:\n{script}\n--- stdout\n{ran.stdout[-3000:]}\n--- stderr\n"
                       f"{ran.stderr[-3000:]}\n{_node_log_tail(day)}")
            assert ran.failed == [], f"a documented command failed: {ran.failed}\n{context}"
            if step.output is not None:
                problems = output_problems(local(step.output), ran.stdout)
                assert problems == [], "the output differs from the doc's:\n" + "\n".join(problems) + "\n" + context
            if "kill %2" in script and "%1" not in script:  # the SIGTERM stop
                assert ran.seconds < STOP_LIMIT_S, f"the node took {ran.seconds:.1f} s to stop\n{context}"
        log = (day / "node.log").read_text()
        assert log.count('"event":"node_stopped"') == 2, _node_log_tail(day)
        assert '"event":"bond_ok"' in log.split('"event":"node_stopped"')[1], "the restarted node kept its bond"
    finally:
        shell.close()
    print(f"first-day walk: seconds by step {timings}")


def _node_log_tail(day: Path) -> str:
    log = day / "node.log"
    return f"--- node.log\n{log.read_text(errors='replace')[-4000:]}" if log.exists() else ""
