"""Open a sweep's report.html in headless Chromium, fail on console errors or a missing part, and render everything.

    python -m reports.browser_check DIR [DIR ...] [--out DIR/render]

Needs Debian's ``chromium``, ``chromium-driver`` and ``poppler-utils`` (``apt-get install chromium
chromium-driver poppler-utils``) and ``pip install selenium``. Writes ``report-html.png`` (a
full-page screenshot after sorting the points table, which exercises its script) and
``report-pdf-<n>.png`` (pdftoppm's render of every PDF page); exits 1 on any console error, on a figure image the
browser could not decode, or where the verdict, the setup line or the figures are missing.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage")


#: what every report's page must show, by element id or selector, as the browser sees it
PARTS = {"verdict": "#verdict li", "setup line": "#setup", "latency definitions": "#latency-definitions",
         "figures": "figure img", "points table": "#points tbody tr"}


def check_html(html: Path, png: Path) -> tuple[list[str], dict[str, int]]:
    """Console errors (SEVERE) after loading and sorting, and the count of each of :data:`PARTS` (figures: those
    whose image decoded, ``figures broken``: those that did not); writes a full-page screenshot."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="cb-chromium-")
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=opts)
    try:
        driver.set_window_size(1300, 1000)
        driver.get(html.resolve().as_uri())
        headers = driver.find_elements(By.CSS_SELECTOR, "#points th")
        tput = [h for h in headers if h.text.strip() == "out tok/s"] or headers[-1:]
        if tput:
            tput[0].click()          # sort by output throughput: runs the page's script
        driver.execute_script("window.scrollTo(0, 0)")
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1300, min(int(height) + 100, 16000))
        driver.save_screenshot(str(png))
        found = {name: len(driver.find_elements(By.CSS_SELECTOR, sel)) for name, sel in PARTS.items()}
        found["figures broken"] = int(driver.execute_script(
            "return Array.from(document.querySelectorAll('figure img'))"
            ".filter(i => !(i.complete && i.naturalWidth > 0)).length"))
        found["figures"] -= found["figures broken"]
        return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"], found
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def render_pdf(pdf: Path, out: Path, dpi: int = 70) -> list[Path]:
    """Every page of ``pdf`` as ``out``/report-pdf-<n>.png at ``dpi``."""
    if not shutil.which("pdftoppm"):
        raise FileNotFoundError("pdftoppm not found: apt-get install poppler-utils")
    subprocess.run(["pdftoppm", "-png", "-r", str(dpi), str(pdf), str(out / "report-pdf")], check=True)
    return sorted(out.glob("report-pdf-*.png"))


def _small(png: Path, width: int = 900) -> Path:
    """The screenshot as a JPEG ``width`` px wide beside it, the PNG removed (a full page is ~2 MB as PNG: too
    much for renders committed to git)."""
    from PIL import Image

    im = Image.open(png).convert("RGB")
    im = im.resize((width, round(im.height * width / im.width)), Image.LANCZOS)
    jpg = png.with_suffix(".jpg")
    im.save(jpg, quality=80, optimize=True)
    png.unlink()
    return jpg


def check(root: Path, out: Path | None = None, small: bool = False, dpi: int = 70,
          found: dict[str, int] | None = None) -> int:
    """One report folder: 0 when the page loads clean with every part, 1 otherwise, 2 when it is missing.
    ``found``, where given, receives the count of each part the browser saw (:data:`PARTS`) and ``pages``."""
    html, pdf = root / "report.html", root / "report.pdf"
    for f in (html, pdf):
        if not f.is_file():
            print(f"{f}: missing; run `python -m harness report {root}` first", file=sys.stderr)
            return 2
    out = out or root / "render"
    seen = found if found is not None else {}
    out.mkdir(parents=True, exist_ok=True)
    errors, found = check_html(html, out / "report-html.png")
    seen.update(found)
    shot = _small(out / "report-html.png") if small else out / "report-html.png"
    pages = render_pdf(pdf, out, 60 if small else dpi)
    seen["pages"] = len(pages)
    missing = [name for name in PARTS if not found.get(name)] + (["figures (broken images)"]
                                                                  if found["figures broken"] else [])
    print(f"{html}: {len(errors)} console errors; {', '.join(f'{v} {k}' for k, v in found.items())}; "
          f"screenshot {shot}")
    print(f"{pdf}: {len(pages)} pages rendered to {out}/report-pdf-*.png")
    for e in errors:
        print(f"  console error: {e}")
    for m in missing:
        print(f"  missing: {m}")
    return 1 if errors or missing else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reports.browser_check", description=__doc__.split("\n")[0])
    p.add_argument("dirs", nargs="+", metavar="DIR", help="folders with report.html and report.pdf")
    p.add_argument("--out", default=None, help="where the PNGs go (default DIR/render; one DIR only)")
    p.add_argument("--small", action="store_true", help="a 900 px JPEG screenshot and 60 dpi pages (renders "
                   "committed to git)")
    args = p.parse_args(argv)
    if args.out and len(args.dirs) > 1:
        p.error("--out takes one DIR")
    rcs = [check(Path(d), Path(args.out) if args.out else None, args.small) for d in args.dirs]
    return max(rcs)


if __name__ == "__main__":
    sys.exit(main())
