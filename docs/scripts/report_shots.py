"""Screenshots of a report page's parts, for the README and docs/demo.md.

    python docs/scripts/report_shots.py RUN_DIR/report.html [--out docs]

writes report-explorer.png and report-embeddings.png: the page's attention explorer (on
its default example, the last layer, head 1) and its PCA map of the SST dev sentences,
each as Debian's chromium draws it headless (apt-get install chromium chromium-driver;
pip install selenium).
"""

import argparse
import shutil
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

PARTS = {"explorer": "report-explorer.png", "embeddings": "report-embeddings.png"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("page", type=Path, help="a report.html (python -m lab.explore report)")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="folder for the PNGs")
    args = parser.parse_args(argv)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--window-size=1000,4000"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        browser.get(args.page.resolve().as_uri())
        for part, name in PARTS.items():
            browser.find_element(By.ID, part).screenshot(str(args.out / name))
            print(args.out / name)
    finally:
        browser.quit()


if __name__ == "__main__":
    main()
