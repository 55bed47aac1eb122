"""Opening a `launchgen report` page in headless Chromium (Debian's `chromium`; `.ci/run` installs it) and
checking that plotly.js drew its figures. A missing Chromium fails the test that needs it, never skips it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "headless Chromium is needed (Debian: apt-get install chromium; .ci/run installs it)"
    return path


def open_in_chromium(page: Path, profile: Path, screenshot: Path | None = None) -> str:
    """The DOM Chromium builds for `page` after its scripts ran, with every host unresolvable (no network)."""
    args = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=http://127.0.0.1:9", "--virtual-time-budget=10000", "--window-size=1280,1600"]
    if screenshot is not None:
        subprocess.run([*args, f"--screenshot={screenshot}", page.as_uri()], capture_output=True, timeout=180,
                       check=True)
    r = subprocess.run([*args, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def assert_figures_rendered(dom: str) -> None:
    """Both figures drawn by plotly.js: their SVG roots, the timeline's bars and markers, the curves' lines."""
    for div in ("timeline-plot", "curves-plot"):
        m = re.search(rf'<div id="{div}"[^>]*class="[^"]*js-plotly-plot', dom)
        assert m, f"{div} was not drawn by plotly.js"
    assert dom.count('class="main-svg"') >= 4  # two SVG layers per figure
    assert 'class="bars"' in dom or "class=\"barlayer" in dom, "no bar was drawn"
    assert dom.count('class="point"') >= 10, "too few markers were drawn"
    assert 'class="js-line"' in dom, "no curve was drawn"
