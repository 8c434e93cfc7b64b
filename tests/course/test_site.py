"""The course as a learner sees it: the site is built, served on 127.0.0.1, and every chapter is
opened in headless Chromium (Debian's package; .ci/run installs it as it installs Graphviz).

Each page must show rendered graphs (SVG with nodes, laid out at a visible size), its tables,
and no script error. A screenshot of each chapter goes to site-screenshots/ for a person to look
at. Without Chromium the test skips, saying so.
"""
import functools
import http.server
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "site-screenshots"
CHAPTERS = sorted(path.stem for path in (ROOT / "course").glob("[0-9][0-9]-*.py"))
# Put in front of every served page: records script errors, then, once the page has loaded,
# what it shows, as attributes of <html> that --dump-dom prints.
PROBE = """<script>
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
window.addEventListener("load", function () {
  var root = document.documentElement, graphs = 0, nodes = 0;
  document.querySelectorAll("svg").forEach(function (svg) {
    var found = svg.querySelectorAll("g.node").length, box = svg.getBoundingClientRect();
    if (found > 0 && box.width > 20 && box.height > 20) { graphs += 1; nodes += found; }
  });
  root.setAttribute("data-graphs", graphs);
  root.setAttribute("data-graph-nodes", nodes);
  root.setAttribute("data-tables", document.querySelectorAll("table").length);
  root.setAttribute("data-errors", JSON.stringify(window.__errors));
});
</script>"""


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):          # quiet
        pass

    def send_head(self):
        path = pathlib.Path(self.translate_path(self.path))
        if path.is_dir():
            path = path / "index.html"
        if path.suffix != ".html" or not path.is_file():
            return super().send_head()
        body = path.read_bytes().replace(b"<head>", b"<head>" + PROBE.encode(), 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


def browse(url, *flags):
    done = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--disable-dev-shm-usage", "--no-first-run", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=8000", *flags, url],
        capture_output=True, text=True, timeout=120, check=False)
    return done


def test_every_chapter_shows_its_graphs_and_tables_in_chromium(tmp_path):
    if chromium() is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run does it "
                    "when it can): the course's pages were not opened in a browser")
    if not shutil.which("dot"):
        pytest.skip("Graphviz's dot is not installed: the chapters have no pictures to check")
    pytest.importorskip("mkdocs")
    pytest.importorskip("jupytext")
    site = tmp_path / "site"
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "-d", str(site)], cwd=ROOT, env=environment,
                           capture_output=True, text=True, timeout=900, check=False)
    assert built.returncode == 0, built.stderr[-3000:]

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    SCREENSHOTS.mkdir(exist_ok=True)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        pages = [("index", f"{base}/course/")] + [(name, f"{base}/course/{name}/")
                                                   for name in CHAPTERS]
        for name, url in pages:
            picture = SCREENSHOTS / f"{name}.png"
            dom = browse(url, "--dump-dom", f"--screenshot={picture}", "--window-size=1280,3000")
            assert dom.returncode == 0, f"{name}: chromium failed: {dom.stderr[-2000:]}"
            opening = re.search(r"<html[^>]*>", dom.stdout)
            opening = opening.group(0) if opening else ""
            shown = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', opening))
            assert shown, f"{name}: the page's probe did not run ({url})"
            errors = json.loads(shown["errors"].replace("&quot;", '"'))
            console = [line for line in dom.stderr.splitlines() if "Uncaught" in line]
            assert errors == [] and console == [], f"{name}: script errors {errors} {console}"
            if name != "index":
                assert int(shown["graphs"]) >= 1 and int(shown["graph-nodes"]) >= 3, \
                    f"{name}: no rendered graph ({shown})"
            assert int(shown["tables"]) >= 1, f"{name}: no table ({shown})"
            assert picture.stat().st_size > 10_000, f"{name}: no screenshot: {dom.stderr[-2000:]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
