"""README.md as a reader uses it: its shell commands run as written, and its links lead somewhere.

Every command of the README's ``bash`` blocks is a test: run here exactly as written (from a
scratch folder, with this environment's ``pax`` first on PATH) and its output checked, or
skipped with the reason ``NOT_RUN`` gives, which the run's summary shows. A command that is
neither fails, and so does a reason no command needs any more, so the lists cannot drift from
the README. The commands run here are the cheap ones (seconds in all); what the others do is
tested where their reason says.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# Command (a regular expression over it, as written) -> why it is not run here.
NOT_RUN = {
    r"git clone .*": "clones the repository this test runs in",
    r"python3 -m venv .*": "makes a virtual environment; the nox sessions make theirs",
    r"pip install -e .*": "installs packages; every nox session installs them, and plugin_kit "
                       "installs pax-core and pax-lm from wheels into fresh environments",
    r"sudo apt install .*": "installs Debian packages as root; .ci/run installs these",
    r"pax train --plugin lm --exp QuickStartLm .*": "trains for minutes; pax_lm/tests "
                                                    "train QuickStartLm shortened",
    r"pax decode --plugin lm .*": "needs the quick start's trained job; pax_lm/tests decode "
                                  "trained jobs through the command",
    r"pax train --plugin vision .*": "trains for about 20 s; pax_vision/tests/"
                                     "test_vision_cli.py trains QuickStartDigits",
    r"pax predict --plugin vision .*": "needs the trained job and an image; "
                                      "pax_vision/tests/test_vision_cli.py predicts",
    r"pax speech make-demo-data .*": "speaks 1,700 utterances (half a minute); pax_speech/tests "
                                     "make the demo data once per run",
    r"pax train --plugin speech .*": "trains for about 10 minutes; pax_speech/tests train "
                                     "QuickStartSpeech shortened",
    r"pax transcribe --plugin speech .*": "needs the trained job; "
                                          "pax_speech/tests/test_speech_cli.py transcribes",
    r"pax train --exp MlpSynthetic .*": "trains (about 10 s with its start-up); tests/ train "
                                        "MlpSynthetic through pax train in many files",
    r"pax eval --job-dir .*": "needs a trained job; tests/test_checkpoint_damage.py evaluates "
                              "one through the command",
    r"pip install nox uv && python3 -m nox -s .*": "CI's test command: the whole suite",
}
# Command -> what its output must hold, for the commands run here.
EXPECTED = {
    "pax --version": re.compile(r"^pax \S+ \(plugin API \S+\)$", re.M),
    "pax plugins": re.compile(r"^lm\tpax-lm\t[^\t]+\t[^\t]+\tactive\t", re.M),
    "pax experiments | grep QuickStart": re.compile(r"^QuickStartLm\tlm\t", re.M),
    "pax config --exp MlpSynthetic --set NUM_TRAIN_STEPS=100":
        re.compile(r"^task\.train\.num_train_steps = 100$", re.M),
}
_FENCE = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
_COMMENT = re.compile(r"\s+#\s.*$")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def commands(text: str) -> list[str]:
    """The commands of ``text``'s bash blocks, a line each (continuations joined, comments
    dropped)."""
    found = []
    for block in _FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            command = " ".join(_COMMENT.sub("", line).split())
            if command and not command.startswith("#"):
                found.append(command)
    return found


COMMANDS = commands(README.read_text())


def _reason(command: str) -> str | None:
    reasons = [why for pattern, why in NOT_RUN.items() if re.fullmatch(pattern, command)]
    assert len(reasons) <= 1, f"{command!r} matches more than one reason not to run it"
    return reasons[0] if reasons else None


def test_no_reason_or_expectation_outlives_its_command():
    stale = [p for p in NOT_RUN if not any(re.fullmatch(p, c) for c in COMMANDS)]
    stale += [c for c in EXPECTED if c not in COMMANDS]
    assert not stale, f"reasons and expectations for commands the README no longer has: {stale}"


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_runs_as_written_or_says_why_not(command, tmp_path):
    reason = _reason(command)
    if command not in EXPECTED:
        assert reason is not None, (f"README.md's {command!r} is neither run by this test nor "
                                    f"given a reason not to be: add it to EXPECTED or NOT_RUN")
        pytest.skip(f"not run here: {reason}")
    assert reason is None, f"{command!r} is both run and given a reason not to be"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr}"
    assert EXPECTED[command].search(done.stdout), f"{command} printed:\n{done.stdout}"


def github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    outside_code = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", outside_code, re.M)}


def test_every_relative_link_leads_to_a_file_and_its_heading():
    text = README.read_text()
    links = [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert len(links) >= 20  # the documentation's pages, the quick starts' anchors
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        page = (README.parent / path).resolve() if path else README
        if not page.exists():
            broken.append(f"{target}: no such file")
        elif anchor and page.suffix == ".md" and anchor not in anchors(page.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {page.relative_to(ROOT)}")
    assert not broken, f"README.md links that lead nowhere: {broken}"
