"""The HTML pages as a person sees them: rendered by headless Chromium, measured in the page.

What the browser checks that the markup cannot: every text of every chart lies inside its
chart (an axis label that does not fit is clipped by the SVG and reads as a wrong number), and a
series whose values differ only by float noise (a constant learning rate read back as ``0.001``
and ``0.0010000000000000002``) is drawn flat, not zoomed onto the noise as a zig-zag.

Chromium runs with a fresh profile and everything that would reach the network off; the pages
load nothing from outside anyway. CI installs it (``.ci/run``); elsewhere the test is skipped
with the reason.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_goodput import Job, at, run_job
from traintel import cli, semconv

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not installed here (apt-get install chromium; CI's .ci/run does)",
    ),
    pytest.mark.process,  # the suite's tiers: tests/tiers.py
]

#: Measures the page and writes the findings into it, for --dump-dom to bring back.
PROBE = """<script>
addEventListener("load", () => {
  const clipped = [], sloped = [];
  for (const svg of document.querySelectorAll("svg.chart")) {
    const box = svg.viewBox.baseVal;
    for (const text of svg.querySelectorAll("text")) {
      const b = text.getBBox();
      if (b.x < 0 || b.y < 0 || b.x + b.width > box.width + 0.5 || b.y + b.height > box.height + 0.5)
        clipped.push(svg.id + ": " + text.textContent);
    }
    const heading = svg.previousElementSibling ? svg.previousElementSibling.textContent : "";
    if (heading.startsWith("lr"))
      for (const line of svg.querySelectorAll("polyline.series"))
        if (line.getBBox().height !== 0) sloped.push(svg.id + ": " + line.getAttribute("points"));
  }
  const lr = [...document.querySelectorAll("h2,h3")].filter(h => h.textContent.startsWith("lr")).length;
  const out = document.createElement("pre");
  out.id = "probe";
  const charts = document.querySelectorAll("svg.chart").length;
  out.textContent = JSON.stringify({clipped, sloped, lr, charts});
  document.body.appendChild(out);
});
</script>"""

#: A constant learning rate as a float round trip leaves it: one ulp apart.
LR = (0.001, 0.0010000000000000002)


def _job(step: float, lr_scale: float):  # type: ignore[no-untyped-def]
    def build(job: Job) -> None:
        app = job.open("application", 0)
        loop = job.open("training_loop", 1, app)
        t = 1.0
        for number in range(12):
            metrics = {
                semconv.METRIC_PREFIX + "lr": LR[number // 2 % 2] * lr_scale,  # windows of 2
                semconv.METRIC_PREFIX + "loss": 2.0 / (number + 1),
                semconv.METRIC_PREFIX + "tokens_seen": 1_234_567_891.25 + 1_000_003.5 * number,
            }
            job.iteration(loop, number, t, t + step, **metrics).end(end_time=at(t + step))
            t += step
        loop.end(end_time=at(t))
        app.end(end_time=at(t + 1))

    return build


def _probe(page: Path, tmp_path: Path) -> dict[str, object]:
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    result: dict[str, object] = json.loads(found[1].replace("&quot;", '"').replace("&amp;", "&"))
    return result


def test_report_and_compare_pages_draw_labels_whole_and_constants_flat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_job(tmp_path / "a", monkeypatch, _job(4, 1.0), run_id="run-a", session="run-a")
    run_job(tmp_path / "b", monkeypatch, _job(5, 3.0), run_id="run-b", session="run-b")
    report, compared = tmp_path / "report.html", tmp_path / "compare.html"
    assert cli.main(["report", str(tmp_path / "a"), "--html", str(report)]) == 0
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--html", str(compared)]) == 0
    capsys.readouterr()
    for page in (report, compared):
        result = _probe(page, tmp_path)
        assert result["lr"] == 1 and result["charts"], result
        assert result["clipped"] == [], f"{page.name}: labels outside their chart: {result['clipped']}"
        assert result["sloped"] == [], f"{page.name}: a constant drawn as a slope: {result['sloped']}"
