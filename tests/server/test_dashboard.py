"""``/dashboard`` rendered by a real headless browser (Debian's chromium, driven by Selenium through
chromedriver): after a known workload, the numbers on the page equal ``/get_server_info`` and the prefix
tables equal ``/cache_tree``. ``--api-key`` guards both routes. Set ``RADIXRT_DASHBOARD_SCREENSHOT=PATH`` to
also save the screenshot there (docs/dashboard.png, shown in docs/cache.md, is made that way)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from server_util import start_server

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "dash-key"
FIELDS = (
    "free_pages",
    "evictable_pages",
    "protected_pages",
    "private_pages",
    "total_pages",
    "page_size",
    "hit_tokens",
    "query_tokens",
)


def chromium_paths() -> tuple[str, str]:
    """The browser and its driver, installed from Debian by tests/install_browser.sh when missing."""
    if not (shutil.which("chromedriver") and shutil.which("chromium")):
        subprocess.run(["sh", str(ROOT / "tests" / "install_browser.sh")], check=True, timeout=900)
    return shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def server():
    s = start_server("--page-size", "16", api_key=API_KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = chromium_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1280,1100",
        "--disable-dev-shm-usage",
    ):
        opts.add_argument(arg)
    d = webdriver.Chrome(service=Service(driver_path), options=opts)
    yield d
    d.quit()


def test_routes_need_the_key_and_top_is_checked(server):
    for path in ("/dashboard", "/cache_tree"):
        r = httpx.get(server.url + path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with server.client() as c:
        for bad in ("abc", "0", "501"):
            r = c.get("/cache_tree", params={"top": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "top", r.text
        page = c.get("/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "http://" not in page.text and "https://" not in page.text  # nothing fetched from outside


def test_dashboard_numbers_equal_server_info(server, browser, passage_ids, tmp_path):
    heads = [passage_ids[:80], passage_ids[500:548]]
    sp = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    with server.client() as c:
        c.post("/flush_cache").raise_for_status()
        for i in range(5):  # two heads (80 and 48 tokens), each request with its own tail: hits after the first
            body = {"input_ids": heads[i % 2] + passage_ids[300 + 30 * i : 330 + 30 * i], "sampling_params": sp}
            out = c.post("/generate", json=body).json()
        # a second turn of the last conversation: its whole first turn is a cached prefix
        body["input_ids"] = body["input_ids"] + out["output_ids"] + passage_ids[700:720]
        assert c.post("/generate", json=body).status_code == 200
        server.wait_idle()
        info = c.get("/get_server_info").json()
        tree = c.get("/cache_tree", params={"top": 5}).json()
    cache = info["cache"]
    assert cache["hit_tokens"] >= 2 * 64 + 32 + 96 and tree["cache"] == cache
    assert tree["latency"]["requests"] >= 6 and tree["num_running"] == 0

    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {API_KEY}"}})
    browser.get(server.url + "/dashboard?top=5&refresh=0.5")
    deadline = time.time() + 60
    text = lambda i: browser.find_element("id", i).text  # noqa: E731
    while text("status") != "live":
        assert time.time() < deadline, f"dashboard never went live: {text('status')}"
        time.sleep(0.2)
    assert text("num_running") == str(info["num_running"]) == "0"
    assert text("num_waiting") == str(info["num_waiting"]) == "0"
    for k in FIELDS:
        assert text(k) == str(cache[k]), k
    assert text("hit_rate") == f"{100 * cache['hit_tokens'] / cache['query_tokens']:.1f}%"
    assert text("eviction_policy") == info["eviction_policy"] == "gdsf"
    assert int(text("requests")) == tree["latency"]["requests"]
    for key in ("largest", "most_hit"):
        # read in one script call: the page re-renders the tables on every refresh
        got = browser.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(tr => [...tr.cells].map(td => td.textContent))",
            f"#{key} tr",
        )
        want = [[str(r["tokens"]), str(r["hits"]), str(r["lock_ref"]), r["text"]] for r in tree["tree"][key]]
        assert got == want and got, key
    assert max(r["tokens"] for r in tree["tree"]["largest"]) == tree["tree"]["largest"][0]["tokens"]
    png = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(png)) and png.read_bytes()[:4] == b"\x89PNG"
    if os.environ.get("RADIXRT_DASHBOARD_SCREENSHOT"):
        shutil.copy(png, os.environ["RADIXRT_DASHBOARD_SCREENSHOT"])
