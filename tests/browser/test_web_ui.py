"""The management web UI in a real browser (issue 15): headless Chromium, driven by selenium,
against a `warren server` of its own, through the element ids the UI keeps stable for it
(login, nav, refresh, overview, queues, queue and exchange pages, and the charts' `<svg>`s with
their data-samples and data-latest attributes).

One module, one browser and one broker, tests in file order (xdist hands a module to one
worker): refused logins, login, the overview, a queue made, published to, read back and
deleted through the forms, 10,000 queues through the API's pagination, then moves, and the
Admin page's shovel and federation sections as each tag sees them. Every test ends
with the browser's console checked: any SEVERE entry fails it (but the 401s a refused login
is answered with)."""

import json
import math
import os
import re
import threading
import time
from urllib.parse import quote

import pytest
import requests

from conftest import EXTERNAL, RUN_ID, start_broker

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="the web UI is Warren's: needs its own Warren broker")

STATS_INTERVAL = 2  # WARREN_STATS_INTERVAL of the broker under test: one message is 0.5/s for 2 s
QUEUE = f"ui-queue-{RUN_ID}"
PAYLOAD = f"hello from the browser {RUN_ID}"
PLAIN_USER = "no-management"  # a user without tags: AMQP yes, management UI no
BULK = 10_000
PAGE_LOAD_LIMIT = 1.0  # seconds, measured in the browser (issue 15: "well under a second")


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def ui_broker():
    old = os.environ.get("WARREN_STATS_INTERVAL")
    os.environ["WARREN_STATS_INTERVAL"] = str(STATS_INTERVAL)
    try:
        b = start_broker()
    finally:
        if old is None:
            del os.environ["WARREN_STATS_INTERVAL"]
        else:
            os.environ["WARREN_STATS_INTERVAL"] = old
    api = requests.Session()
    api.auth = ("guest", "guest")
    b.http = api
    api.put(f"{b.api}/users/{PLAIN_USER}", json={"password": "secret", "tags": ""}).raise_for_status()
    api.put(f"{b.api}/permissions/%2F/{PLAIN_USER}",
            json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
    yield b
    api.close()
    b.stop()


@pytest.fixture(scope="module")
def base(ui_broker) -> str:
    return f"http://127.0.0.1:{ui_broker.mgmt_port}/"


class Console:
    """The browser's console log since the last check; SEVERE entries fail the test."""

    def __init__(self, driver):
        self.driver = driver
        self.allowed: list[str] = []

    def allow(self, pattern: str) -> None:
        self.allowed.append(pattern)

    def check(self) -> None:
        entries = self.driver.get_log("browser")
        severe = [e for e in entries if e["level"] == "SEVERE"
                  and not any(re.search(p, e["message"]) for p in self.allowed)]
        self.allowed = []
        assert not severe, "console errors:\n" + "\n".join(e["message"] for e in severe)


@pytest.fixture(scope="module")
def console(chrome):
    return Console(chrome)


@pytest.fixture(autouse=True)
def _no_console_errors(console):
    yield
    console.check()


@pytest.fixture(scope="module")
def traffic(ui_broker):
    """Messages flowing while the overview is looked at (and screenshotted): a publisher to
    'orders' and 'emails', a consumer acking from 'emails'. stop() ends it."""
    import pika

    stop = threading.Event()
    errors: list[BaseException] = []

    def publish():
        try:
            conn = pika.BlockingConnection(ui_broker.pika_params())
            ch = conn.channel()
            for name in ("orders", "emails"):
                ch.queue_declare(name, durable=True)
            n = 0
            while not stop.is_set():
                ch.basic_publish("", "orders", b'{"order": %d}' % n)
                ch.basic_publish("", "emails", b"mail %d" % n)
                n += 1
                conn.sleep(0.05)
            conn.close()
        except BaseException as err:  # noqa: BLE001 (reported by stop())
            errors.append(err)

    def consume():
        try:
            conn = pika.BlockingConnection(ui_broker.pika_params())
            ch = conn.channel()
            ch.queue_declare("emails", durable=True)
            ch.basic_qos(prefetch_count=20)
            ch.basic_consume("emails", lambda c, m, p, b: c.basic_ack(m.delivery_tag))
            while not stop.is_set():
                conn.process_data_events(time_limit=0.1)
            conn.close()
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=publish, daemon=True), threading.Thread(target=consume, daemon=True)]

    class Traffic:
        def start(self):
            for t in threads:
                t.start()

        def stop(self):
            stop.set()
            for t in threads:
                if t.is_alive():
                    t.join(5)
            assert not errors, errors

    t = Traffic()
    yield t
    stop.set()


# ------------------------------------------------------------------ helpers
def wait(driver, condition, timeout=10.0, message=""):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    from selenium.common.exceptions import TimeoutException

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05,
                             ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
                             ).until(lambda d: condition())
    except TimeoutException:
        pass
    # What the page shows, to tell why.
    state = driver.execute_script("""
        const error = document.getElementById('error');
        return {hash: location.hash, error: error && !error.hidden ? error.textContent : null,
                main: (document.getElementById('main') || document.body).innerText.slice(0, 600),
                api: performance.getEntriesByType('resource').filter(e => e.name.includes('/api/'))
                       .slice(-8).map(e => `${e.name} ${Math.round(e.duration)} ms`)};""")
    raise AssertionError(f"{message or 'timed out'} (after {timeout} s): {json.dumps(state, indent=1)}")


def by_css(driver, selector):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver, selector):
    from selenium.webdriver.common.by import By
    return driver.find_elements(By.CSS_SELECTOR, selector)


def visible(driver, selector) -> bool:
    found = all_css(driver, selector)
    return bool(found) and found[0].is_displayed()


def chart_latest(driver, selector) -> dict:
    return json.loads(by_css(driver, selector).get_attribute("data-latest") or "{}")


def chart_samples(driver, selector) -> int:
    return int(by_css(driver, selector).get_attribute("data-samples") or 0)


def set_value(driver, selector, value) -> None:
    """Type into an input or textarea, or choose in a select."""
    from selenium.webdriver.support.ui import Select

    element = by_css(driver, selector)
    if element.tag_name == "select":
        Select(element).select_by_value(value)
    else:
        element.clear()
        element.send_keys(value)


def no_error_shown(driver) -> None:
    error = by_css(driver, "#error")
    assert not error.is_displayed(), f"#error shows: {error.text}"


def accept_confirms(driver) -> None:
    """Destructive buttons ask with window.confirm(): say yes, and keep the questions."""
    driver.execute_script("window.__confirms = []; window.confirm = (m) => { window.__confirms.push(m); return true; };")


SCREENSHOTS = os.environ.get("WARREN_UI_SCREENSHOTS")


def screenshot(driver, name, charts=()) -> None:
    """Save the page as WARREN_UI_SCREENSHOTS/name, if set; then with some history in the
    charts (selectors) first: ten samples."""
    if not SCREENSHOTS:
        return
    for chart in charts:
        wait(driver, lambda: chart_samples(driver, chart) >= 10, timeout=20)
    os.makedirs(SCREENSHOTS, exist_ok=True)
    assert driver.save_screenshot(os.path.join(SCREENSHOTS, name))


def open_page(driver, base, hash_route) -> None:
    """Go to a page of the single page app (same document: no reload)."""
    driver.get(base + hash_route)


def log_in(driver, base, user, password) -> None:
    driver.get(base)
    wait(driver, lambda: visible(driver, "#login-form"), message="the login form is not shown")
    set_value(driver, "#login-username", user)
    set_value(driver, "#login-password", password)
    by_css(driver, "#login-submit").click()


def row_names(driver) -> list[str]:
    """The queues list's rows, read at once (the table is replaced at each refresh)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#queues-table tr[data-name]')].map(r => r.dataset.name)")


def queue_row(driver, name, vhost="/"):
    return by_css(driver, f'#queues-table tr[data-name="{name}"][data-vhost="{vhost}"]')


# ------------------------------------------------------------------ login
def test_a_wrong_password_is_refused(chrome, base, console):
    console.allow(r"/api/whoami .*status of 401")
    log_in(chrome, base, "guest", "not-the-password")
    wait(chrome, lambda: visible(chrome, "#login-error") and "Login failed" in by_css(chrome, "#login-error").text,
         message="no 'Login failed' for a wrong password")
    assert not by_css(chrome, "#nav").is_displayed()
    assert visible(chrome, "#login-form")


def test_a_user_without_a_management_tag_is_refused(chrome, base, console):
    console.allow(r"/api/whoami .*status of 401")
    log_in(chrome, base, PLAIN_USER, "secret")
    wait(chrome, lambda: "Not management user" in by_css(chrome, "#login-error").text,
         message="no 'Not management user' for a user without tags")
    assert by_css(chrome, "#login-error").is_displayed()
    assert not by_css(chrome, "#nav").is_displayed()


def test_login(chrome, base):
    log_in(chrome, base, "guest", "guest")
    wait(chrome, lambda: visible(chrome, "#nav"), message="no navigation after logging in")
    assert not visible(chrome, "#login-form")
    assert by_css(chrome, "#whoami").text == "guest"
    for page in ("overview", "connections", "channels", "exchanges", "queues", "streams", "admin", "definitions"):
        assert by_css(chrome, f'#nav a[data-page="{page}"]').is_displayed(), page
    assert by_css(chrome, "#logout").is_displayed()
    # Refresh every second, to keep this module quick; the choice is kept.
    set_value(chrome, "#refresh-interval", "1000")
    assert chrome.execute_script("return localStorage.getItem('warren.refresh')") == "1000"
    no_error_shown(chrome)


# ------------------------------------------------------------------ overview
def test_the_overview_shows_totals_and_live_charts(chrome, base, ui_broker, traffic):
    traffic.start()
    open_page(chrome, base, "#/")
    wait(chrome, lambda: visible(chrome, "#overview-totals") and by_css(chrome, "#overview-totals").text.strip(),
         message="no totals on the overview")
    for section in ("#node-memory", "#node-disk", "#alarms", "#nodes", "#listeners"):
        assert by_css(chrome, section).is_displayed(), section
    # The nodes (one here; every member of a cluster): this one, running.
    node = ui_broker.http.get(f"{ui_broker.api}/overview").json()["node"]
    wait(chrome, lambda: f"{node}\nrunning" in by_css(chrome, "#nodes").text.replace("\t", "\n")
         or f"{node} running" in by_css(chrome, "#nodes").text, message="the node is not in the nodes table")
    rates, queued = "#chart-message-rates", "#chart-queued-messages"
    wait(chrome, lambda: chart_samples(chrome, rates) >= 1 and chart_samples(chrome, queued) >= 1,
         message="the overview's charts have no samples")
    first = chart_samples(chrome, rates), chart_samples(chrome, queued)
    # The traffic shows: messages are queued (orders has no consumer) and published, and
    # the totals count the two queues and the traffic's two connections.
    wait(chrome, lambda: chart_latest(chrome, rates).get("publish", 0) > 0, timeout=3 * STATS_INTERVAL + 5,
         message=f"no publish rate on the overview's chart: {chart_latest(chrome, rates)}")
    wait(chrome, lambda: chart_latest(chrome, queued).get("messages", 0) > 0,
         message=f"no queued messages on the overview's chart: {chart_latest(chrome, queued)}")
    wait(chrome, lambda: chart_samples(chrome, rates) > first[0] and chart_samples(chrome, queued) > first[1],
         message="the overview's charts gain no samples")
    totals = by_css(chrome, "#overview-totals").text
    overview = ui_broker.http.get(f"{ui_broker.api}/overview").json()
    assert str(overview["object_totals"]["queues"]) in totals
    assert str(overview["object_totals"]["connections"]) in totals
    # Everything the page loaded came from its own origin (no CDN, no outside fonts).
    loaded = chrome.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    origin = base.rstrip("/")
    assert loaded and all(url.startswith(origin + "/") for url in loaded), loaded
    no_error_shown(chrome)
    screenshot(chrome, "overview.png", charts=(rates, queued))


# ------------------------------------------------------------------ a queue through the forms
def test_a_queue_is_added_through_the_form(chrome, base, ui_broker):
    by_css(chrome, '#nav a[data-page="queues"]').click()
    wait(chrome, lambda: visible(chrome, "#add-queue-form"), message="no add-queue form")
    set_value(chrome, "#add-queue-vhost", "/")
    set_value(chrome, "#add-queue-name", QUEUE)
    set_value(chrome, "#add-queue-type", "classic")
    set_value(chrome, "#add-queue-durable", "true")
    by_css(chrome, "#add-queue-submit").click()
    wait(chrome, lambda: queue_row(chrome, QUEUE).is_displayed(), message=f"{QUEUE} is not listed")
    got = ui_broker.http.get(f"{ui_broker.api}/queues/%2F/{QUEUE}").json()
    assert got["durable"] is True and got["type"] == "classic"
    no_error_shown(chrome)


def test_a_message_is_published_through_the_default_exchange(chrome, base):
    open_page(chrome, base, "#/exchanges/%2F/amq.default")
    wait(chrome, lambda: visible(chrome, "#publish-payload"), message="no publish form on amq.default's page")
    set_value(chrome, "#publish-routing-key", QUEUE)
    set_value(chrome, "#publish-delivery-mode", "2")
    set_value(chrome, "#publish-payload", PAYLOAD)
    by_css(chrome, "#publish-submit").click()
    wait(chrome, lambda: by_css(chrome, "#publish-result").text.strip(), message="no publish result")
    assert by_css(chrome, "#publish-result").text.strip() == "Message published."
    no_error_shown(chrome)


def test_the_queue_page_shows_its_depth_and_the_publish_rate(chrome, base):
    open_page(chrome, base, f"#/queues/%2F/{quote(QUEUE, safe='')}")
    wait(chrome, lambda: visible(chrome, "#queue-messages"), message="no queue page")
    # The page refreshes every second; the publish rate (one message over the broker's
    # 2 s sampling interval) shows at some refresh: a watcher in the page keeps the highest.
    chrome.execute_script("""
        window.__maxPublish = 0;
        window.__watch = setInterval(() => {
          const chart = document.getElementById('chart-queue-rates');
          if (!chart) return;
          try {
            const latest = JSON.parse(chart.getAttribute('data-latest') || '{}');
            window.__maxPublish = Math.max(window.__maxPublish, latest.publish || 0);
          } catch (_) {}
        }, 50);""")
    wait(chrome, lambda: by_css(chrome, "#queue-messages").text.strip() == "1",
         message=f"depth is not 1: {by_css(chrome, '#queue-messages').text!r}")
    assert by_css(chrome, "#queue-ready").text.strip() == "1"
    assert by_css(chrome, "#queue-unacked").text.strip() == "0"
    wait(chrome, lambda: chart_latest(chrome, "#chart-queue-lengths").get("messages") == 1,
         message=f"queue lengths chart: {chart_latest(chrome, '#chart-queue-lengths')}")
    wait(chrome, lambda: chrome.execute_script("return window.__maxPublish") > 0, timeout=3 * STATS_INTERVAL + 5,
         message="the queue's rate chart never showed a publish rate")
    chrome.execute_script("clearInterval(window.__watch)")
    assert chart_samples(chrome, "#chart-queue-rates") >= 1
    no_error_shown(chrome)
    screenshot(chrome, "queue.png", charts=("#chart-queue-lengths", "#chart-queue-rates"))


def test_the_message_is_got_back(chrome, base, ui_broker):
    accept_confirms(chrome)
    set_value(chrome, "#get-count", "1")
    set_value(chrome, "#get-ackmode", "ack_requeue_false")
    set_value(chrome, "#get-encoding", "auto")
    by_css(chrome, "#get-submit").click()
    wait(chrome, lambda: all_css(chrome, "#get-results .message"), message="no message got")
    messages = all_css(chrome, "#get-results .message")
    assert len(messages) == 1
    assert by_css(chrome, "#get-results .message .message-payload").text.strip() == PAYLOAD
    # Taken (ack_requeue_false): the depth goes to 0, on the page and in its chart.
    wait(chrome, lambda: by_css(chrome, "#queue-messages").text.strip() == "0", message="depth is not back to 0")
    wait(chrome, lambda: chart_latest(chrome, "#chart-queue-lengths").get("messages") == 0,
         message=f"queue lengths chart: {chart_latest(chrome, '#chart-queue-lengths')}")
    assert ui_broker.http.get(f"{ui_broker.api}/queues/%2F/{QUEUE}").json()["messages"] == 0
    no_error_shown(chrome)


def test_the_queues_list_shows_depths(chrome, base, ui_broker, traffic):
    traffic.stop()
    by_css(chrome, '#nav a[data-page="queues"]').click()
    wait(chrome, lambda: queue_row(chrome, "orders").is_displayed(), message="orders is not listed")
    # (The traffic's connections are closed: what the consumer had not acked is back in emails.)
    depths = {name: ui_broker.http.get(f"{ui_broker.api}/queues/%2F/{name}").json()["messages"]
              for name in ("orders", "emails")}
    assert depths["orders"] > 0
    # (The list may show it a refresh late.)
    cells = """return Object.fromEntries([...document.querySelectorAll('#queues-table tr[data-name]')].map(
        r => [r.dataset.name, ['messages', 'ready', 'unacked'].map(c => r.querySelector('td.' + c).textContent)]))"""
    expected = {"orders": [str(depths["orders"]), str(depths["orders"]), "0"],
                "emails": [str(depths["emails"]), str(depths["emails"]), "0"], QUEUE: ["0", "0", "0"]}
    wait(chrome, lambda: {name: [v.replace(",", "").strip() for v in values]
                          for name, values in chrome.execute_script(cells).items()} == expected,
         message=f"the list does not show {expected}: {chrome.execute_script(cells)}")
    info = by_css(chrome, "#queues-page-info").text
    assert re.fullmatch(r"page 1 of 1, 3 queues", info), info
    no_error_shown(chrome)
    screenshot(chrome, "queues.png")


def test_the_queue_is_deleted_through_its_page(chrome, base, ui_broker, console):
    # (The page stops refreshing before it deletes: no 404 of the queue in the console.)
    open_page(chrome, base, f"#/queues/%2F/{quote(QUEUE, safe='')}")
    wait(chrome, lambda: visible(chrome, "#delete-submit"), message="no delete button")
    accept_confirms(chrome)
    by_css(chrome, "#delete-submit").click()
    wait(chrome, lambda: ui_broker.http.get(f"{ui_broker.api}/queues/%2F/{QUEUE}").status_code == 404,
         message="the queue was not deleted")
    assert chrome.execute_script("return window.__confirms.length") == 1, "delete did not ask first"
    wait(chrome, lambda: visible(chrome, "#queues-table"), message="not back on the queues list")
    assert all_css(chrome, f'#queues-table tr[data-name="{QUEUE}"]') == []
    no_error_shown(chrome)


# ------------------------------------------------------------------ 10,000 queues
# Set when the queues page counts as loaded: its page info says how many queues there are and
# the table's first row is there. Installed at each new document (before the page's scripts).
WATCHER = r"""
window.__loaded = null;
window.__expect = %s;
new MutationObserver((_, observer) => {
  const info = document.getElementById('queues-page-info');
  const row = document.querySelector('#queues-table tr[data-name]');
  if (info && row && info.textContent.replace(/(\d),(?=\d)/g, '$1').includes(', ' + window.__expect + ' queues')) {
    window.__loaded = performance.now();
    observer.disconnect();
  }
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


def test_ten_thousand_queues_page_quickly(chrome, base, ui_broker):
    defs = {"queues": [{"name": f"bulk-{i:05d}", "vhost": "/", "durable": False, "auto_delete": False,
                        "arguments": {}} for i in range(BULK)]}
    ui_broker.http.post(f"{ui_broker.api}/definitions", json=defs).raise_for_status()
    total = ui_broker.http.get(f"{ui_broker.api}/queues", params={"page": 1, "page_size": 1}).json()["total_count"]
    assert total >= BULK
    set_value(chrome, "#refresh-interval", "5000")  # the default, as a user would have it

    def from_click() -> float:
        """From the overview, a click on Queues until its first page is shown."""
        open_page(chrome, base, "#/")
        wait(chrome, lambda: visible(chrome, "#overview-totals"))
        chrome.execute_script(WATCHER % total + "window.__clicked = performance.now();")
        by_css(chrome, '#nav a[data-page="queues"]').click()
        # (wait's failure shows the page's text: no element is read here, before the page is drawn)
        wait(chrome, lambda: chrome.execute_script("return window.__loaded") is not None, timeout=30,
             message=f"the queues page never said {total} queues")
        return chrome.execute_script("return (window.__loaded - window.__clicked) / 1000")

    def on_reload() -> float:
        """A new document on #/queues (a reload): from the navigation's start to the first page."""
        script = chrome.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCHER % total})
        try:
            chrome.refresh()
            wait(chrome, lambda: chrome.execute_script("return window.__loaded") is not None, timeout=30,
                 message="the reloaded queues page never showed its first page")
            return chrome.execute_script("return window.__loaded / 1000")
        finally:
            chrome.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})

    def best_of_three(measure) -> float:
        # (CI's other worker may hold both cores for a moment: a load counts if one of three
        # attempts is under the limit.)
        times = []
        while len(times) < 3 and (not times or min(times) >= PAGE_LOAD_LIMIT):
            times.append(measure())
        return min(times)

    clicked = best_of_three(from_click)
    reloaded = best_of_three(on_reload)
    api_calls = chrome.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('/api/queues'))"
        ".map(e => Math.round(e.duration))")
    timings = (f"queues page with {total} queues: {clicked:.3f} s from the click, {reloaded:.3f} s reloaded "
               f"(its /api/queues call: {api_calls} ms)")
    print(timings)

    # One page only in the browser, and a pager over all of them.
    rows, info = chrome.execute_script(
        "return [[...document.querySelectorAll('#queues-table tr[data-name]')].map(r => r.dataset.name),"
        " document.getElementById('queues-page-info').textContent]")
    match = re.fullmatch(r"page 1 of (\d+), (\d+) queues", re.sub(r"(\d),(?=\d)", r"\1", info))
    assert match, info
    pages = int(match.group(1))
    assert int(match.group(2)) == total and pages == math.ceil(total / len(rows)) > 1
    first = rows

    # Paging.
    by_css(chrome, "#queues-next").click()
    wait(chrome, lambda: by_css(chrome, "#queues-page-info").text.startswith(f"page 2 of {pages}"), timeout=30)
    wait(chrome, lambda: row_names(chrome) and row_names(chrome) != first, timeout=30)
    second = row_names(chrome)
    assert second and not set(second) & set(first)
    by_css(chrome, "#queues-prev").click()
    wait(chrome, lambda: by_css(chrome, "#queues-page-info").text.startswith(f"page 1 of {pages}"), timeout=30)
    wait(chrome, lambda: row_names(chrome)
         == first, timeout=30)

    # The name filter finds one queue among them.
    started = time.monotonic()
    set_value(chrome, "#queues-filter", "bulk-04242")
    wait(chrome, lambda: row_names(chrome)
         == ["bulk-04242"], timeout=30, message="the filter did not find bulk-04242")
    print(f"filtered in {time.monotonic() - started:.3f} s (a 250 ms pause for typing included)")
    assert re.match(r"page 1 of 1, 1 queue", by_css(chrome, "#queues-page-info").text)
    no_error_shown(chrome)

    assert max(clicked, reloaded) < PAGE_LOAD_LIMIT, timings


def test_logout(chrome, base):
    by_css(chrome, "#logout").click()
    wait(chrome, lambda: visible(chrome, "#login-form"), message="no login form after logging out")
    assert not by_css(chrome, "#nav").is_displayed()
    chrome.refresh()  # the credentials are forgotten: a reload asks again
    wait(chrome, lambda: visible(chrome, "#login-form"), message="logged in again after a reload")
    assert not by_css(chrome, "#nav").is_displayed()


# ------------------------------------------------------------------ move messages
@pytest.mark.parametrize("user, tags", [("ui-admin", "administrator"), ("ui-policymaker", "policymaker")])
def test_messages_are_moved_to_another_queue(chrome, base, ui_broker, user, tags):
    """The queue page's Move (a shovel parameter, as RabbitMQ's UI does it) moves every
    message, and #move-status follows it to the end: through /api/shovels for an
    administrator, through the shovel's parameter for a policymaker (who may not read
    /api/shovels, as in RabbitMQ)."""
    import pika

    http = ui_broker.http
    http.put(f"{ui_broker.api}/users/{user}", json={"password": "pw", "tags": tags}).raise_for_status()
    http.put(f"{ui_broker.api}/permissions/%2F/{user}",
             json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
    source, destination = f"move-from-{user}-{RUN_ID}", f"move-to-{user}-{RUN_ID}"
    conn = pika.BlockingConnection(ui_broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(source, durable=True)
    for i in range(5):
        ch.basic_publish("", source, b"move %d" % i)
    conn.close()
    log_in(chrome, base, user, "pw")
    wait(chrome, lambda: visible(chrome, "#nav"), message=f"{user} is not logged in")
    open_page(chrome, base, f"#/queues/%2F/{quote(source, safe='')}")
    wait(chrome, lambda: visible(chrome, "#move-destination"), message="no move form")
    set_value(chrome, "#move-destination", destination)
    by_css(chrome, "#move-submit").click()
    wait(chrome, lambda: "has finished" in by_css(chrome, "#move-status").text, timeout=20,
         message="#move-status does not say the move finished")
    counts = {q: http.get(f"{ui_broker.api}/queues/%2F/{q}").json()["messages"] for q in (source, destination)}
    assert counts == {source: 0, destination: 5}
    no_error_shown(chrome)
    by_css(chrome, "#logout").click()
    wait(chrome, lambda: visible(chrome, "#login-form"), message="no login form after logging out")


def test_a_management_user_is_offered_only_what_it_may_do(chrome, base, ui_broker):
    """A user tagged management alone: no Admin (no shovels nor federation links), no
    Definitions, no Move (a shovel parameter), and no call the API would refuse it (a 401 or 403 in the console fails the test)."""
    http, user = ui_broker.http, "ui-management"
    http.put(f"{ui_broker.api}/users/{user}", json={"password": "pw", "tags": "management"}).raise_for_status()
    http.put(f"{ui_broker.api}/permissions/%2F/{user}",
             json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
    queue = f"plain-{RUN_ID}"
    http.put(f"{ui_broker.api}/queues/%2F/{queue}", json={"durable": False}).raise_for_status()
    log_in(chrome, base, user, "pw")
    wait(chrome, lambda: visible(chrome, "#nav"), message=f"{user} is not logged in")
    for page, shown in (("overview", True), ("queues", True), ("admin", False), ("definitions", False)):
        assert by_css(chrome, f'#nav a[data-page="{page}"]').is_displayed() == shown, page
    wait(chrome, lambda: visible(chrome, "#overview-totals"), message="no overview")
    open_page(chrome, base, f"#/queues/%2F/{quote(queue, safe='')}")
    wait(chrome, lambda: visible(chrome, "#get-submit"), message="no queue page")
    assert not chrome.find_elements("css selector", "#move-destination")
    # Nor the shovels' and federation links' status or parameters, even at #/admin.
    open_page(chrome, base, "#/admin")
    wait(chrome, lambda: by_css(chrome, "#main h1").text == "Admin", message="no Admin page")
    assert not chrome.find_elements("css selector", "#main section")
    time.sleep(1.5)  # a refresh or two at 1 s: their calls are checked too
    no_error_shown(chrome)
    by_css(chrome, "#logout").click()
    wait(chrome, lambda: visible(chrome, "#login-form"), message="no login form after logging out")


# ------------------------------------------------------------------ shovels and federation
def log_in_as(chrome, base, ui_broker, user, tags, vhosts=("/",)) -> None:
    """Make `user` (password "pw", `tags`, every permission in `vhosts`), log in as them and
    refresh every second."""
    http = ui_broker.http
    http.put(f"{ui_broker.api}/users/{user}", json={"password": "pw", "tags": tags}).raise_for_status()
    for vhost in vhosts:
        http.put(f"{ui_broker.api}/permissions/{quote(vhost, safe='')}/{user}",
                 json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
    log_in(chrome, base, user, "pw")
    wait(chrome, lambda: visible(chrome, "#nav"), message=f"{user} is not logged in")
    set_value(chrome, "#refresh-interval", "1000")


def log_out(chrome) -> None:
    by_css(chrome, "#logout").click()
    wait(chrome, lambda: visible(chrome, "#login-form"), message="no login form after logging out")


def row_cells(driver, table_id, row_selector) -> dict | None:
    """A row of a table as {column title: cell text}, read at once (the tables are replaced at
    each refresh); None if there is no such row."""
    return driver.execute_script("""
        const table = document.getElementById(arguments[0]);
        const row = table && table.querySelector(arguments[1]);
        if (!row) return null;
        const titles = [...table.querySelectorAll('thead th')].map(th => th.textContent);
        return Object.fromEntries([...row.cells].map((td, i) => [titles[i], td.innerText.trim()]));""",
                                 table_id, row_selector)


def click_in_row(driver, table_id, row_selector, text) -> None:
    """Click a row's button, found and clicked at once (in the page, between two refreshes)."""
    wait(driver, lambda: driver.execute_script("""
        const table = document.getElementById(arguments[0]);
        const row = table && table.querySelector(arguments[1]);
        const button = row && [...row.querySelectorAll('button')].find(b => b.textContent === arguments[2]);
        if (button) button.click();
        return !!button;""", table_id, row_selector, text), message=f"no {text} button in {table_id} {row_selector}")


def restarted(driver, table_id, row_selector, field, running) -> None:
    """Click the row's Restart and see its "Last changed" move on (a second later: the
    timestamps count seconds), its `field` back at `running`."""
    before = row_cells(driver, table_id, row_selector)["Last changed"]
    time.sleep(1.1)
    click_in_row(driver, table_id, row_selector, "Restart")
    wait(driver, lambda: (cells := row_cells(driver, table_id, row_selector)) is not None
         and cells["Last changed"] != before and cells[field] == running,
         message=f"{row_selector} was not restarted: {row_cells(driver, table_id, row_selector)}")


def test_an_administrator_adds_restarts_and_deletes_shovels_through_the_forms(chrome, base, ui_broker, console):
    """Shovel Management's form makes the shovel parameters RabbitMQ's UI would (checked
    through the API), Shovel Status shows the shovel running (and it moves messages), Restart
    starts it again, Delete in either list deletes it; a refused form shows the API's reason."""
    import pika

    http = ui_broker.http
    log_in_as(chrome, base, ui_broker, "ui-links-admin", "administrator")
    open_page(chrome, base, "#/admin")
    wait(chrome, lambda: visible(chrome, "#add-shovel-form") and visible(chrome, "#shovels-table"),
         message="no shovel sections on the Admin page")
    accept_confirms(chrome)

    # No source queue nor exchange: refused, with the API's reason shown.
    console.allow(r"/api/parameters/shovel/.* status of 400")
    set_value(chrome, "#add-shovel-name", "ui-incomplete")
    set_value(chrome, "#add-shovel-dest-name", "anywhere")
    by_css(chrome, "#add-shovel-submit").click()
    wait(chrome, lambda: visible(chrome, "#error"), message="no error for a shovel without a source")
    reason = by_css(chrome, "#error").text
    assert "src-queue" in reason or "src-exchange" in reason, reason
    assert http.get(f"{ui_broker.api}/parameters/shovel/%2F/ui-incomplete").status_code == 404

    # Queue to queue within the broker.
    source, destination = f"shovel-from-{RUN_ID}", f"shovel-to-{RUN_ID}"
    set_value(chrome, "#add-shovel-name", "ui-shovel")
    set_value(chrome, "#add-shovel-src-name", source)
    set_value(chrome, "#add-shovel-dest-name", destination)
    set_value(chrome, "#add-shovel-prefetch", "10")
    set_value(chrome, "#add-shovel-reconnect-delay", "1")
    set_value(chrome, "#add-shovel-ack-mode", "on-publish")
    by_css(chrome, "#add-shovel-submit").click()
    row = '[data-name="ui-shovel"][data-vhost="/"]'
    wait(chrome, lambda: (row_cells(chrome, "shovels-table", row) or {}).get("State") == "running",
         message="ui-shovel is not running in Shovel Status")
    no_error_shown(chrome)
    assert http.get(f"{ui_broker.api}/parameters/shovel/%2F/ui-shovel").json()["value"] == {
        "src-uri": "amqp://", "src-queue": source, "dest-uri": "amqp://", "dest-queue": destination,
        "src-prefetch-count": 10, "src-delete-after": "never", "dest-add-forward-headers": False,
        "reconnect-delay": 1, "ack-mode": "on-publish"}
    status = row_cells(chrome, "shovels-table", row)
    assert status["Source"].split() == ["amqp://", source, "queue"], status
    assert status["Destination"].split() == ["amqp://", destination, "queue"], status
    managed = row_cells(chrome, "shovel-parameters-table", row)
    assert (managed["Prefetch"], managed["Reconnect delay"], managed["Ack mode"], managed["Delete after"]) == \
        ("10", "1 s", "on-publish", "never"), managed
    conn = pika.BlockingConnection(ui_broker.pika_params())
    ch = conn.channel()
    for i in range(3):
        ch.basic_publish("", source, b"shovelled %d" % i)
    conn.close()
    wait(chrome, lambda: http.get(f"{ui_broker.api}/queues/%2F/{destination}").json().get("messages") == 3,
         message="the shovel did not move the messages")

    restarted(chrome, "shovels-table", row, "State", "running")
    click_in_row(chrome, "shovels-table", row, "Delete")
    wait(chrome, lambda: row_cells(chrome, "shovels-table", row) is None, message="ui-shovel is still listed")
    assert http.get(f"{ui_broker.api}/parameters/shovel/%2F/ui-shovel").status_code == 404
    assert chrome.execute_script("return window.__confirms") == [
        "Restart shovel ui-shovel?", "Delete shovel ui-shovel?"]

    # From an exchange with a key, to an exchange through either of two URIs, deleted after
    # five messages; then deleted through Shovel Management.
    set_value(chrome, "#add-shovel-name", "ui-shovel-x")
    set_value(chrome, "#add-shovel-src-kind", "exchange")
    set_value(chrome, "#add-shovel-src-name", "amq.topic")
    set_value(chrome, "#add-shovel-src-key", "ui.#")
    set_value(chrome, "#add-shovel-dest-uri", "amqp:///%2F amqp://")
    set_value(chrome, "#add-shovel-dest-kind", "exchange")
    set_value(chrome, "#add-shovel-dest-name", "amq.fanout")
    set_value(chrome, "#add-shovel-delete-after", "count")
    set_value(chrome, "#add-shovel-delete-after-count", "5")
    set_value(chrome, "#add-shovel-forward-headers", "true")
    for field in ("prefetch", "reconnect-delay"):
        by_css(chrome, f"#add-shovel-{field}").clear()
    set_value(chrome, "#add-shovel-ack-mode", "on-confirm")
    by_css(chrome, "#add-shovel-submit").click()
    row = '[data-name="ui-shovel-x"][data-vhost="/"]'
    wait(chrome, lambda: row_cells(chrome, "shovel-parameters-table", row), message="ui-shovel-x is not listed")
    no_error_shown(chrome)
    assert http.get(f"{ui_broker.api}/parameters/shovel/%2F/ui-shovel-x").json()["value"] == {
        "src-uri": "amqp://", "src-exchange": "amq.topic", "src-exchange-key": "ui.#",
        "dest-uri": ["amqp:///%2F", "amqp://"], "dest-exchange": "amq.fanout", "src-delete-after": 5,
        "dest-add-forward-headers": True, "ack-mode": "on-confirm"}
    managed = row_cells(chrome, "shovel-parameters-table", row)
    assert managed["Source"].split() == ["amqp://", "amq.topic", ":", "ui.#", "exchange"], managed
    assert managed["Destination"].split() == ["amqp:///%2F", "amqp://", "amq.fanout", "exchange"], managed
    assert managed["Forward headers"] == "yes" and managed["Delete after"] == "5", managed
    click_in_row(chrome, "shovel-parameters-table", row, "Delete")
    wait(chrome, lambda: row_cells(chrome, "shovel-parameters-table", row) is None,
         message="ui-shovel-x is still listed")
    assert http.get(f"{ui_broker.api}/parameters/shovel/%2F/ui-shovel-x").status_code == 404
    no_error_shown(chrome)
    log_out(chrome)


def test_an_administrator_federates_an_exchange_through_the_forms(chrome, base, ui_broker):
    """Federation Upstreams' form makes the upstream parameter (another vhost of this broker,
    reached through its port), the policy form federates an exchange with it, Federation
    Status shows the link running and restarts it, and deleting the upstream ends the link."""
    http = ui_broker.http
    upstream_vhost, exchange = f"ui-upstream-{RUN_ID}", f"ui-federated-{RUN_ID}"
    http.put(f"{ui_broker.api}/vhosts/{upstream_vhost}").raise_for_status()
    http.put(f"{ui_broker.api}/permissions/{upstream_vhost}/guest",
             json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
    http.put(f"{ui_broker.api}/exchanges/%2F/{exchange}", json={"type": "topic"}).raise_for_status()
    log_in_as(chrome, base, ui_broker, "ui-links-admin", "administrator")
    open_page(chrome, base, "#/admin")
    wait(chrome, lambda: visible(chrome, "#add-upstream-form") and visible(chrome, "#federation-links-table"),
         message="no federation sections on the Admin page")
    accept_confirms(chrome)

    uri = f"amqp://guest:guest@127.0.0.1:{ui_broker.port}/{upstream_vhost}"
    set_value(chrome, "#add-upstream-name", "ui-up")
    set_value(chrome, "#add-upstream-uri", uri)
    set_value(chrome, "#add-upstream-max-hops", "2")
    set_value(chrome, "#add-upstream-expires", "600000")
    set_value(chrome, "#add-upstream-message-ttl", "60000")
    set_value(chrome, "#add-upstream-prefetch", "50")
    set_value(chrome, "#add-upstream-reconnect-delay", "1")
    set_value(chrome, "#add-upstream-trust-user-id", "true")
    by_css(chrome, "#add-upstream-submit").click()
    row = '[data-name="ui-up"][data-vhost="/"]'
    wait(chrome, lambda: row_cells(chrome, "federation-upstreams-table", row), message="ui-up is not listed")
    no_error_shown(chrome)
    assert http.get(f"{ui_broker.api}/parameters/federation-upstream/%2F/ui-up").json()["value"] == {
        "uri": uri, "max-hops": 2, "expires": 600000, "message-ttl": 60000, "prefetch-count": 50,
        "reconnect-delay": 1, "ack-mode": "on-confirm", "trust-user-id": True}
    listed = row_cells(chrome, "federation-upstreams-table", row)
    assert listed["URI"] == f"amqp://guest:[redacted]@127.0.0.1:{ui_broker.port}/{upstream_vhost}", listed
    assert (listed["Max hops"], listed["Expires"], listed["Trust user id"]) == ("2", "600000 ms", "yes"), listed

    set_value(chrome, "#add-policy-name", "ui-federate")
    set_value(chrome, "#add-policy-pattern", f"^{exchange}$")
    set_value(chrome, "#add-policy-apply-to", "exchanges")
    set_value(chrome, "#add-policy-definition", "federation-upstream=ui-up")
    by_css(chrome, "#add-policy-submit").click()
    link = f'[data-upstream="ui-up"][data-vhost="/"][data-target="{exchange}"]'
    wait(chrome, lambda: (row_cells(chrome, "federation-links-table", link) or {}).get("State") == "running",
         timeout=15, message="no running link in Federation Status")
    no_error_shown(chrome)
    status = row_cells(chrome, "federation-links-table", link)
    assert status["URI"] == f"amqp://127.0.0.1:{ui_broker.port}/{upstream_vhost}", status
    assert status["Exchange / queue"].split() == [exchange, "exchange"], status
    assert status["Upstream"] == "ui-up" and status["Error"] == "", status

    restarted(chrome, "federation-links-table", link, "State", "running")
    click_in_row(chrome, "federation-upstreams-table", row, "Delete")
    wait(chrome, lambda: row_cells(chrome, "federation-links-table", link) is None,
         message="the link outlived its upstream")
    assert http.get(f"{ui_broker.api}/parameters/federation-upstream/%2F/ui-up").status_code == 404
    assert chrome.execute_script("return window.__confirms") == ["Restart the link to ui-up?", "Delete upstream ui-up?"]
    no_error_shown(chrome)
    log_out(chrome)
    http.delete(f"{ui_broker.api}/policies/%2F/ui-federate").raise_for_status()
    http.delete(f"{ui_broker.api}/vhosts/{upstream_vhost}").raise_for_status()


@pytest.mark.parametrize("user, tags", [("ui-links-monitor", "monitoring"), ("ui-links-policymaker", "policymaker")])
def test_the_link_sections_follow_the_users_tags(chrome, base, ui_broker, user, tags):
    """A monitoring user sees Shovel Status and Federation Status but no form; a policymaker
    Shovel Management and Federation Upstreams (and the policies) but no status; neither the
    administrator's sections, and no call the API refuses (a 401 in the console fails it)."""
    http, name = ui_broker.http, f"ui-seen-by-{user}"
    http.put(f"{ui_broker.api}/parameters/shovel/%2F/{name}", json={"value": {
        "src-uri": "amqp://", "src-queue": f"{name}-from", "dest-uri": "amqp://", "dest-queue": f"{name}-to"}}
             ).raise_for_status()
    log_in_as(chrome, base, ui_broker, user, tags)
    assert by_css(chrome, '#nav a[data-page="admin"]').is_displayed()
    open_page(chrome, base, "#/admin")
    row = f'[data-name="{name}"][data-vhost="/"]'
    monitor = tags == "monitoring"
    if monitor:
        wait(chrome, lambda: (row_cells(chrome, "shovels-table", row) or {}).get("State") == "running",
             message=f"{user} does not see {name} running")
        assert visible(chrome, "#federation-links-table")
    else:
        wait(chrome, lambda: row_cells(chrome, "shovel-parameters-table", row), message=f"{user} does not see {name}")
        assert visible(chrome, "#federation-upstreams-table")
    time.sleep(1.5)  # a refresh or two at 1 s: their calls are checked too
    shown = {selector: bool(all_css(chrome, selector)) for selector in (
        "#shovels-table", "#federation-links-table", "#shovel-parameters-table", "#federation-upstreams-table",
        "#add-shovel-form", "#add-upstream-form", "#add-policy-form", "#users-table", "#vhost-limits-table")}
    expected = {"#shovels-table": monitor, "#federation-links-table": monitor,
                "#shovel-parameters-table": not monitor, "#federation-upstreams-table": not monitor,
                "#add-shovel-form": not monitor, "#add-upstream-form": not monitor, "#add-policy-form": not monitor,
                "#users-table": False, "#vhost-limits-table": False}
    assert shown == expected
    no_error_shown(chrome)
    log_out(chrome)
    http.delete(f"{ui_broker.api}/parameters/shovel/%2F/{name}").raise_for_status()
