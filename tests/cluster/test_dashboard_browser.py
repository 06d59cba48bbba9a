"""The dashboard in a real browser (issue 14): Debian's chromium, driven headless by Selenium
through Debian's chromedriver (no browser download), against a real 3-node cluster.

The page must load without console errors, show the three nodes, show a queue that jobs were
added to with its length, pause it from the queue page (QSTAT confirms), and its charts must
update. With DISQUE_SCREENSHOTS=<dir> it also saves the screenshots the README shows
(`DISQUE_SCREENSHOTS=docs .venv/bin/python -m pytest tests/cluster/test_dashboard_browser.py`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from disque.tools.ports import free_port
from tests.cluster.conftest import Cluster, cmd
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

webdriver = pytest.importorskip("selenium.webdriver")
if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    # `make test` installs them (Makefile system-deps): a skip here is a missing install
    pytest.skip("Debian chromium and chromium-driver are not installed (make system-deps)",
                allow_module_level=True)

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

QUEUE = "dashboard-q"
JOBS = 7


@contextlib.contextmanager
def chromium(tmp_path: Path, *extra: str) -> Iterator[Any]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path / 'chromium'}", *extra):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "chromium", ignore_errors=True)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with chromium(tmp_path) as driver:
        yield driver


def with_http(c: Cluster) -> list[int]:
    """Give every node an HTTP port at runtime (CONFIG SET http-port); the ports."""
    ports = []
    for p in c:
        hp = free_port(bus_offset=0)
        assert cmd(p, "CONFIG", "SET", "http-port", str(hp)) == "OK"
        ports.append(hp)
    return ports


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def texts(driver: Any, css: str, attr: str | None = None) -> list[str]:
    """The text (or attribute `attr`) of every element matching css, read in one script:
    the page redraws its tables every 400 ms, so an element found by one WebDriver call can
    be gone by the next (StaleElementReferenceException)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), "
        "e => arguments[1] === null ? e.innerText.trim() : (e.getAttribute(arguments[1]) || ''))",
        css, attr)


def text_of(driver: Any, css: str, attr: str | None = None) -> str:
    found = texts(driver, css, attr)
    return found[0] if found else ""


def click(driver: Any, css: str, what: str) -> None:
    """Click the element matching css, found again if a redraw replaced it between the find
    and the click (StaleElementReferenceException: nothing was clicked)."""
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, css).click() or True, timeout=20,
             what=what)


def samples(driver: Any, chart: str) -> int:
    return int(text_of(driver, f"#{chart}", "data-samples") or 0)


@contextlib.contextmanager
def traffic(node: Any) -> Iterator[None]:
    """Producers and consumers on a few queues, for screenshots that show some life."""
    stop = threading.Event()

    def run() -> None:
        with Conn(node.port) as c:
            n = 0
            while not stop.is_set():
                n += 1
                for q, k in (("orders", 6), ("emails", 3), ("thumbnails", 2)):
                    c.pipeline([("ADDJOB", q, f"{q}-{n}", 0, "REPLICATE", 2)] * k)
                    got = c.cmd("GETJOB", "NOHANG", "COUNT", k - (n % 3 == 0), "FROM", q)
                    ids = [j[1] for j in got or []]
                    if ids:
                        c.cmd("ACKJOB", *ids)
                stop.wait(0.05)

    t = threading.Thread(target=run)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=30)


def test_dashboard_shows_the_cluster_and_pauses_a_queue(
        cluster: Callable[..., Cluster], browser: Any) -> None:
    c = cluster(3)
    ports = with_http(c)
    first = c[0]
    for i in range(JOBS):
        reply = cmd(first, "ADDJOB", QUEUE, f"job {i}", 0, "REPLICATE", 2)
        assert not isinstance(reply, Err), reply
    for i in range(3):  # a second queue, and some traffic for the rate chart
        cmd(first, "ADDJOB", "other-q", f"o{i}", 0, "REPLICATE", 1)
    cmd(first, "GETJOB", "NOHANG", "FROM", "other-q")

    browser.get(f"http://127.0.0.1:{ports[0]}/?interval=400")
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")) == 3,
             timeout=20, what="three nodes in the cluster table")
    assert set(texts(browser, "#nodes tbody tr", "data-node")) == set(c.ids())
    wait_for(lambda: all("up" in t or "self" in t for t in texts(browser, "#nodes tbody tr")),
             timeout=20, what="every link up")
    # peers' numbers come from their own INFO: no 'unreachable' row
    wait_for(lambda: "unreachable" not in text_of(browser, "#nodes tbody"), timeout=20,
             what="every node's INFO")
    # each node's jobs on disk (overflow is off here: 0 on every row)
    assert texts(browser, "#nodes tbody td.ondisk") == ["0", "0", "0"]

    queue_len = f'#queues tbody tr[data-queue="{QUEUE}"] td.len'
    wait_for(lambda: text_of(browser, queue_len) == str(JOBS), timeout=20,
             what="the queue with its length")
    # the charts update: more samples at each poll
    seen = wait_for(lambda: samples(browser, "chart-rates") >= 2 and
                    samples(browser, "chart-rates"), timeout=20, what="the rate chart")
    wait_for(lambda: samples(browser, "chart-rates") > seen, timeout=20,
             what="the rate chart to update")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-depth polyline")
    shots = os.environ.get("DISQUE_SCREENSHOTS")
    if shots:
        with traffic(first):
            wait_for(lambda: samples(browser, "chart-rates") >= 25, timeout=60,
                     what="a minute of samples")
        browser.save_screenshot(str(Path(shots) / "dashboard-cluster.png"))

    # the queue page: its jobs, then PAUSE all through the button
    click(browser, f'#queues tbody tr[data-queue="{QUEUE}"] a', "a click on the queue")
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == JOBS,
             timeout=20, what="the queue's jobs")
    assert text_of(browser, "#queue-name") == QUEUE
    click(browser, 'button[data-pause="all"]', "a click on PAUSE all")
    wait_for(lambda: dict(zip(*[iter(cmd(first, "QSTAT", QUEUE))] * 2, strict=True))
             [b"pause"] == b"all", timeout=20, what="QSTAT to say paused")
    wait_for(lambda: "active" in text_of(browser, 'button[data-pause="all"]', "class"),
             timeout=20, what="the page to show the pause")
    assert text_of(browser, '#queue-stat dd[data-field="pause"]') == "all"

    # the job page (SHOW) from the queue page
    click(browser, "#jobs tbody tr a", "a click on the queue's first job")
    wait_for(lambda: text_of(browser, '#job-show dd[data-field="queue"]') == QUEUE,
             timeout=20, what="the job page")
    assert text_of(browser, "#job-body").startswith("job ")

    if shots:  # a busy queue's page for the README
        with traffic(first):
            browser.get(f"http://127.0.0.1:{ports[0]}/?interval=400#/queue/orders")
            wait_for(lambda: samples(browser, "chart-queue") >= 20, timeout=60,
                     what="some samples of the queue page")
        browser.save_screenshot(str(Path(shots) / "dashboard-queue.png"))

    errors = console_errors(browser)
    assert not errors, errors


def test_dashboard_works_with_the_node_password(tmp_path: Path, browser: Any) -> None:
    hp = free_port(bus_offset=0)
    node = DisqueProcess(tmp_path / "node", args=["--http-port", str(hp),
                                                  "--requirepass", "s3cret"])
    node.start(wait=False)  # (the harness's readiness PING would get -NOAUTH)
    try:
        def authed() -> Conn:
            c = Conn(node.port)
            assert c.cmd("AUTH", "s3cret") == "OK"
            return c

        with wait_for(authed, timeout=30, what="the node") as c:
            for i in range(3):
                c.cmd("ADDJOB", QUEUE, f"job {i}", 0)
        # without the password: the 401 page, no dashboard
        browser.get(f"http://127.0.0.1:{hp}/")
        assert not browser.find_elements(By.CSS_SELECTOR, "#nodes")
        # with it (as after the browser's login prompt): the page and its API calls work
        browser.get(f"http://user:s3cret@127.0.0.1:{hp}/?interval=400")
        wait_for(lambda: text_of(browser, f'#queues tbody tr[data-queue="{QUEUE}"] td.len')
                 == "3", timeout=20, what="the queue, read with the password")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")) == 1
        errors = [e for e in console_errors(browser) if "401" not in e["message"]]
        assert not errors, errors
    finally:
        node.kill()


def spki_pin(crt: Path) -> str:
    """base64(sha256(SubjectPublicKeyInfo)) of a certificate, as chromium's
    --ignore-certificate-errors-spki-list takes it: the browser then accepts exactly this
    key (the test CA is not in its trust store)."""
    import base64
    import hashlib
    import subprocess

    pem = subprocess.run(["openssl", "x509", "-in", str(crt), "-pubkey", "-noout"],
                         capture_output=True, check=True, timeout=30).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pem,
                         capture_output=True, check=True, timeout=30).stdout
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def test_dashboard_over_https_with_tls_http(tmp_path: Path) -> None:
    """`tls-http yes` (issue 23): the dashboard and its API calls over HTTPS in chromium."""
    from tests.tlscerts import make_pki

    pki = make_pki(tmp_path / "pki")
    hp = free_port(bus_offset=0)
    node = DisqueProcess(tmp_path / "node", args=[
        "--http-port", str(hp), "--tls-http", "yes", "--tls-cert-file", str(pki.server_crt),
        "--tls-key-file", str(pki.server_key), "--tls-auth-clients", "no"])
    node.start()
    try:
        for i in range(4):
            cmd(node, "ADDJOB", QUEUE, f"job {i}", 0)
        with chromium(tmp_path,
                      f"--ignore-certificate-errors-spki-list={spki_pin(pki.server_crt)}"
                      ) as browser:
            browser.get(f"https://127.0.0.1:{hp}/?interval=400")
            wait_for(lambda: text_of(browser, f'#queues tbody tr[data-queue="{QUEUE}"] td.len')
                     == "4", timeout=20, what="the queue, over HTTPS")
            assert len(browser.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")) == 1
            assert not console_errors(browser), console_errors(browser)
            assert browser.current_url.startswith("https://")
    finally:
        node.kill()
