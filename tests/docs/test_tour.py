"""The README's tour runs: its one bash block, between `<!-- tour:begin -->` and
`<!-- tour:end -->`, against a real `make dev` stack, with `bash -euo pipefail`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from configuration.api_address import API_URL_FILE
from configuration.settings import PROJECT_ROOT
from tests.devstack.stack import DevStack

README = PROJECT_ROOT / "README.md"
BEGIN = "<!-- tour:begin -->"
END = "<!-- tour:end -->"
# The tour calls the API through this variable, set from `OUTBOX_API_URL` or `DEV_API_PORT`:
# the test's stack listens on ports of its own.
TOUR_API = '"$API'
TOUR_API_LINE = "API=${OUTBOX_API_URL:-http://127.0.0.1:${DEV_API_PORT:-8000}}"
TOUR_TIMEOUT_S = 120
_BASH_BLOCK = re.compile(r"^```bash[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


class NoTour(ValueError):
    """The text holds no tour block, or not exactly one bash block between the markers."""


def tour_script(text: str) -> str:
    """The bash block between the tour markers of a README's `text`."""
    _, begin, rest = text.partition(BEGIN)
    between, end, _ = rest.partition(END)
    if not begin or not end:
        raise NoTour(f"README has no tour block: no {BEGIN} ... {END} lines")
    blocks = _BASH_BLOCK.findall(between)
    if len(blocks) != 1:
        raise NoTour(f"the tour block holds {len(blocks)} ```bash blocks, not one")
    return str(blocks[0])


def run_tour(script: str, api: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """`script` run as a user would paste it, in a shell whose `OUTBOX_API_URL` is `api`."""
    path = workdir / "tour.sh"
    path.write_text(script)
    return subprocess.run(
        ["bash", "-euo", "pipefail", str(path)],
        env={**os.environ, "OUTBOX_API_URL": api},
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=TOUR_TIMEOUT_S,
    )


@pytest.mark.timeout(TOUR_TIMEOUT_S + 180)
def test_the_readme_tour_runs_against_make_dev(tmp_path: Path) -> None:
    try:
        script = tour_script(README.read_text())
    except NoTour as err:
        pytest.fail(str(err))
    assert script.splitlines()[1] == TOUR_API_LINE, "the tour names its API first"
    stack = DevStack(tmp_path / "data")
    try:
        stack.start()
        # Where the `outbox` CLI finds this stack's API by default (`configuration.api_address`).
        assert (tmp_path / "data" / API_URL_FILE).read_text().strip() == stack.api
        ran = run_tour(script, stack.api, tmp_path)
    finally:
        stopped = stack.stop()

    assert ran.returncode == 0, (
        f"the tour failed ({ran.returncode})\n--- stdout\n{ran.stdout[-3000:]}\n"
        f"--- stderr\n{ran.stderr[-3000:]}\n--- stack\n{stack.output()}"
    )
    assert stopped == 0, stack.output()


def test_the_tour_is_the_one_bash_block_between_the_markers() -> None:
    readme = (
        "# Title\n```bash\necho before\n```\n"
        f"{BEGIN}\nSome prose.\n```bash\ncurl -s {TOUR_API}/healthz\necho done\n```\n{END}\n"
        "```bash\necho after\n```\n"
    )

    assert tour_script(readme) == f"curl -s {TOUR_API}/healthz\necho done\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("# A README without a tour\n```bash\necho hi\n```\n", "README has no tour block"),
        (f"{BEGIN}\n```bash\necho hi\n```\n", "README has no tour block"),
        (f"{BEGIN}\n```sh\necho hi\n```\n{END}\n", "holds 0 ```bash blocks"),
        (f"{BEGIN}\n```bash\na\n```\n```bash\nb\n```\n{END}\n", "holds 2 ```bash blocks"),
    ],
)
def test_a_missing_or_ambiguous_tour_is_named(text: str, problem: str) -> None:
    with pytest.raises(NoTour, match=re.escape(problem)):
        tour_script(text)


def test_a_failing_step_fails_the_tour(tmp_path: Path) -> None:
    script = f'{TOUR_API_LINE}\necho "$API/v1"\nfalse | cat\necho "never reached"\n'

    ran = run_tour(script, "http://127.0.0.1:1", tmp_path)

    assert ran.returncode != 0  # pipefail: the failing `false` fails the pipe
    assert ran.stdout == "http://127.0.0.1:1/v1\n"


def test_the_tour_follows_the_configured_api_and_hard_codes_no_port() -> None:
    script = tour_script(README.read_text())

    assert TOUR_API_LINE in script
    assert ":8000" not in script.replace(TOUR_API_LINE, "")
    assert "localhost" not in script
