"""The node's HTTP side (issue 14): /metrics, the JSON API, its limits, http-port at runtime.

Every test talks to a real `disque-server` with `--http-port` over real sockets: /metrics is
read with prometheus_client's own text parser and compared with INFO / QSTAT of the same
node; actions are checked with the RESP commands they stand for.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from disque.http.app import MAX_BODY, MAX_CONNECTIONS
from disque.tools.ports import free_port
from tests.harness import REPO, DisqueProcess, wait_for
from tests.integration.resp import Conn, Err, add, info, qstat, show
from tests.threads import Background


def http_port() -> int:
    return free_port(bus_offset=0)


@pytest.fixture(scope="module")
def hnode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DisqueProcess]:
    hp = http_port()
    proc = DisqueProcess(tmp_path_factory.mktemp("http"), args=["--http-port", str(hp)])
    proc.http_port = hp  # type: ignore[attr-defined]
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


def request(port: int, path: str, body: Any = None, *, password: str | None = None,
            content_type: str = "application/json", raw: bytes | None = None,
            timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request; (status, headers, body) whatever the status."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 method="POST" if data is not None else "GET")
    if data is not None:
        req.add_header("Content-Type", content_type)
    if password is not None:
        token = base64.b64encode(f"user:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def get_json(port: int, path: str, **kw: Any) -> Any:
    status, _, body = request(port, path, **kw)
    assert status == 200, (status, body)
    return json.loads(body)


def scrape(port: int, **kw: Any) -> dict[str, Any]:
    status, headers, body = request(port, "/metrics", **kw)
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def sample(families: dict[str, Any], family: str, name: str | None = None,
           **labels: str) -> float:
    """The one sample of `family` (sample name `name`, default the family's) with `labels`."""
    fam = families[family]
    want = name or fam.name
    found = [s.value for s in fam.samples
             if s.name == want and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (family, labels, fam.samples)
    return found[0]


# ---------------------------------------------------------------------------- /metrics
def test_metrics_parse_and_match_info_and_qstat_under_load(hnode: DisqueProcess, q: str) -> None:
    port = hnode.http_port  # type: ignore[attr-defined]
    stop = threading.Event()
    acked: list[str] = []
    nacked: list[str] = []

    def load() -> None:
        with Conn(hnode.port) as c:
            while not stop.is_set():
                ids = [r for r in c.pipeline([("ADDJOB", q, "x" * 50, 0)] * 20)]
                got = c.cmd("GETJOB", "NOHANG", "COUNT", 10, "FROM", q) or []
                for i, job in enumerate(got):
                    if i % 3 == 0:
                        assert c.cmd("NACK", job[1]) == 1
                        nacked.append(job[1])
                    else:
                        assert c.cmd("ACKJOB", job[1]) == 1
                        acked.append(job[1])
                assert all(not isinstance(r, Err) for r in ids)

    loader = Background(load)  # its assertions fail the test through result()
    try:
        # the queue exists once the loader's first ADDJOB ran (a scrape before it would
        # rightly have no series for it: that race failed this test once)
        wait_for(lambda: any(s.labels.get("queue") == q
                             for s in scrape(port)["disque_queue_jobs_added"].samples),
                 what=f"queue {q} in /metrics")
        # scrapes while the node is busy: every one parses and has the queue's series
        deadline = time.monotonic() + 1.5
        scrapes = 0
        while time.monotonic() < deadline or scrapes < 3:
            fams = scrape(port)
            assert sample(fams, "disque_queue_jobs_added", "disque_queue_jobs_added_total",
                          queue=q) >= 0
            scrapes += 1
    finally:
        stop.set()
    loader.result(timeout=30)
    assert acked and nacked

    with Conn(hnode.port) as c:
        st = qstat(c, q)
        inf = info(c, "all")
        fams = scrape(port)
        qlen = c.cmd("QLEN", q)
    assert st is not None
    # types follow the Prometheus rules
    assert fams["disque_queue_jobs_added"].type == "counter"
    assert fams["disque_queue_length"].type == "gauge"
    assert fams["disque_jobs"].type == "gauge"
    assert fams["disque_commands"].type == "counter"
    assert all(name.startswith("disque_") for name in fams)
    # per queue: QSTAT / QLEN and what the load thread did
    assert sample(fams, "disque_queue_length", queue=q) == qlen == st["len"]
    assert sample(fams, "disque_queue_jobs_enqueued", "disque_queue_jobs_enqueued_total",
                  queue=q) == st["jobs-in"]
    assert sample(fams, "disque_queue_jobs_delivered", "disque_queue_jobs_delivered_total",
                  queue=q) == st["jobs-out"]
    added = sample(fams, "disque_queue_jobs_added", "disque_queue_jobs_added_total", queue=q)
    requeued = sample(fams, "disque_queue_jobs_requeued", "disque_queue_jobs_requeued_total",
                      queue=q)
    assert added + requeued == st["jobs-in"]
    assert requeued == len(nacked)  # only NACK put jobs back
    assert sample(fams, "disque_queue_jobs_nacked", "disque_queue_jobs_nacked_total",
                  queue=q) == len(nacked)
    assert sample(fams, "disque_queue_jobs_acked", "disque_queue_jobs_acked_total",
                  queue=q) == len(acked)
    assert sample(fams, "disque_queue_paused", queue=q, direction="in") == 0
    assert sample(fams, "disque_queue_blocked_clients", queue=q) == 0
    assert sample(fams, "disque_queue_oldest_job_age_seconds", queue=q) >= 0
    # node: INFO's numbers. Jobs by state come from a census of the registry that scrapes
    # share for a while (CENSUS_REUSE), so the node being idle now, a later one matches.
    assert sample(fams, "disque_census_age_seconds") >= 0
    def census_matches() -> dict[str, Any]:
        f = scrape(port)
        total = sum(s.value for s in f["disque_jobs"].samples)
        return f if total == int(inf["registered_jobs"]) else {}

    later = wait_for(census_matches, timeout=20, what="disque_jobs to add up to INFO's")
    assert sample(later, "disque_jobs", state="queued") == qlen
    assert sample(later, "disque_jobs", state="active") == int(inf["registered_jobs"]) - qlen
    assert sample(later, "disque_queue_active_jobs", queue=q) == int(inf["registered_jobs"]) - qlen
    assert sample(fams, "disque_memory_used_bytes") == int(inf["used_memory"])
    assert sample(fams, "disque_memory_max_bytes") == 1024 ** 3
    assert sample(fams, "disque_queues") == int(inf["registered_queues"])
    calls = dict(kv.split("=") for kv in inf["cmdstat_addjob"].split(","))
    assert sample(fams, "disque_commands", "disque_commands_total",
                  command="addjob") == int(calls["calls"])
    assert sample(fams, "disque_cluster_known_nodes") == 1
    assert sample(fams, "disque_cluster_nodes", flag="myself") == 1
    assert sample(fams, "disque_bus_links_up") == 0
    assert sample(fams, "disque_aof_enabled") == 0
    assert sample(fams, "disque_aof_last_write_ok") == 1
    assert sample(fams, "disque_aof_write_errors", "disque_aof_write_errors_total") == 0
    for metric, total, field in (
            ("disque_rereplication_pending", None, "rereplication_pending"),
            ("disque_jobs_rereplicated", "disque_jobs_rereplicated_total", "rereplicated_jobs"),
            ("disque_jobs_underreplicated", None, "underreplicated_jobs"),
            ("disque_jobs_repaired", "disque_jobs_repaired_total", "repaired_jobs"),
            ("disque_overflow_jobs", None, "overflow_jobs"),
            ("disque_overflow_bytes", None, "overflow_bytes"),
            ("disque_overflow_file_bytes", None, "overflow_file_bytes"),
            ("disque_overflow_written_jobs", "disque_overflow_written_jobs_total",
             "overflow_written_jobs"),
            ("disque_overflow_read_jobs", "disque_overflow_read_jobs_total",
             "overflow_read_jobs")):
        assert fams[metric].type == ("counter" if total else "gauge")
        assert sample(fams, metric, total or metric) == int(inf[field])


def test_metrics_count_command_errors(hnode: DisqueProcess, q: str) -> None:
    port = hnode.http_port  # type: ignore[attr-defined]
    before = scrape(port)

    def errors(fams: dict[str, Any], kind: str) -> float:
        fam = fams["disque_command_errors"]
        return sum(s.value for s in fam.samples
                   if s.labels == {"command": "show", "kind": kind})

    with Conn(hnode.port) as c:
        assert isinstance(c.cmd("SHOW", "not-an-id"), Err)  # the handler fails: BADID
        assert isinstance(c.cmd("SHOW"), Err)  # refused before it: arity
        assert isinstance(c.cmd("NOSUCHCOMMAND"), Err)
    after = scrape(port)
    assert errors(after, "failed") == errors(before, "failed") + 1
    assert errors(after, "rejected") == errors(before, "rejected") + 1
    assert sample(after, "disque_unknown_commands", "disque_unknown_commands_total") == \
        sample(before, "disque_unknown_commands", "disque_unknown_commands_total") + 1


def test_metrics_queue_label_is_capped_busiest_first(tmp_path: Path) -> None:
    hp = http_port()
    proc = DisqueProcess(tmp_path, args=["--http-port", str(hp), "--metrics-max-queues", "2"])
    proc.start()
    try:
        with Conn(proc.port) as c:
            for n, name in enumerate(["small", "big", "medium", "tiny"]):
                for _ in range([2, 9, 5, 1][n]):
                    add(c, name)
        fams = scrape(hp)
        shown = {s.labels["queue"] for s in fams["disque_queue_length"].samples}
        assert shown == {"big", "medium"}
        assert sample(fams, "disque_metrics_queues_omitted") == 2
        with Conn(proc.port) as c:
            assert c.cmd("CONFIG", "SET", "metrics-max-queues", "0") == "OK"
        assert scrape(hp)["disque_queue_length"].samples == []
    finally:
        proc.kill()


def test_many_queues_give_the_busiest_and_the_count(tmp_path: Path) -> None:
    hp = http_port()
    proc = DisqueProcess(tmp_path, args=["--http-port", str(hp)]).start()
    try:
        with Conn(proc.port) as c:
            n = 2000
            for i in range(0, n, 500):
                c.pipeline([("ADDJOB", f"q{j}", "x", 0) for j in range(i, i + 500)])
            c.pipeline([("ADDJOB", "q7", "x", 0)] * 5 + [("ADDJOB", "q9", "x", 0)] * 3)
        listed = get_json(hp, "/api/queues")
        assert listed["count"] == n and len(listed["queues"]) == 500
        assert [q["name"] for q in listed["queues"][:2]] == ["q7", "q9"]
        assert [q["len"] for q in listed["queues"]] == sorted(
            (q["len"] for q in listed["queues"]), reverse=True)
        node = get_json(hp, "/api/node")
        assert node["queues"] == n and node["totals"]["added"] == n + 8
        fams = scrape(hp)
        assert sample(fams, "disque_queues") == n
        assert sample(fams, "disque_metrics_queues_omitted") == n - 100
        assert sample(fams, "disque_queue_length", queue="q7") == 6
    finally:
        proc.kill()


# ---------------------------------------------------------------------------- JSON API
def test_api_reads_node_queues_queue_and_job(hnode: DisqueProcess, q: str) -> None:
    port = hnode.http_port  # type: ignore[attr-defined]
    with Conn(hnode.port) as c:
        ids = [add(c, q, f"body-{i}") for i in range(3)]
        [[_, raw_id, _]] = c.cmd("GETJOB", "FROM", q)
        fetched = raw_id.decode()
    node = get_json(port, "/api/node")
    assert node["myself"]["port"] == hnode.port
    assert node["info"]["Jobs"]["registered_jobs"] >= 3
    assert isinstance(node["census_age"], float) and node["census_age"] >= 0
    queues = {x["name"]: x for x in get_json(port, "/api/queues")["queues"]}
    assert queues[q]["len"] == 2 and queues[q]["added"] == 3
    # `active` comes from the registry census, which a request may get up to CENSUS_REUSE
    # times its cost old (an earlier test's census, on a loaded machine): it catches up.
    wait_for(lambda: {x["name"]: x for x in get_json(port, "/api/queues")["queues"]}[q][
        "active"] == 1, what="the census counting the fetched job as active")
    one = get_json(port, f"/api/queues/{q}")
    assert one["stat"]["len"] == 2
    assert one["head"] == [i for i in ids if i != fetched]
    assert {j["id"]: j["state"] for j in one["jobs"]} == {
        i: ("active" if i == fetched else "queued") for i in ids}
    for i in ids:  # IDs hold '/' and '+': raw or percent-encoded (as the dashboard sends)
        for path in (f"/api/jobs/{i}", f"/api/jobs/{urllib.parse.quote(i, safe='')}"):
            job = get_json(port, path)
            assert job["id"] == i and job["queue"] == q
    assert get_json(port, f"/api/jobs/{ids[0]}")["body"] == "body-0"
    odd = "a/b c+d/pause"  # any queue name works in the path, encoded
    with Conn(hnode.port) as c:
        add(c, odd)
    assert get_json(port, f"/api/queues/{urllib.parse.quote(odd, safe='')}")["stat"]["len"] == 1
    status, _, body = request(port, f"/api/queues/{urllib.parse.quote(odd, safe='')}/pause",
                              {"state": "in"})
    assert status == 200 and json.loads(body) == {"pause": "in"}
    cluster = get_json(port, "/api/cluster")
    [me] = cluster["nodes"]
    assert me["flags"] == ["myself"] and me["link"] == "self"
    assert me["info"]["registered_jobs"] >= 3


def test_api_actions_run_the_node_commands(hnode: DisqueProcess, q: str) -> None:
    port = hnode.http_port  # type: ignore[attr-defined]
    with Conn(hnode.port) as c:
        a, b, d = (add(c, q, "x") for _ in range(3))
        c.cmd("GETJOB", "COUNT", 3, "FROM", q)

        status, _, body = request(port, f"/api/queues/{q}/pause", {"state": "all"})
        assert status == 200 and json.loads(body) == {"pause": "all"}
        assert qstat(c, q)["pause"] == b"all"
        assert request(port, f"/api/queues/{q}/pause", {"state": "none"})[0] == 200
        assert qstat(c, q)["pause"] == b"none"

        assert json.loads(request(port, "/api/jobs/nack", {"ids": [a]})[2])["count"] == 1
        assert show(c, a)["nacks"] == 1 and show(c, a)["state"] == b"queued"
        assert json.loads(request(port, "/api/jobs/enqueue", {"ids": [b]})[2])["count"] == 1
        assert show(c, b)["state"] == b"queued"
        assert json.loads(request(port, "/api/jobs/ack", {"ids": [d]})[2])["count"] == 1
        assert show(c, d) is None  # a single-node job is deleted at once
        assert json.loads(request(port, "/api/jobs/deljob", {"ids": [a, b]})[2])["count"] == 2
        assert c.cmd("QLEN", q) == 0


def test_api_bad_input(hnode: DisqueProcess, q: str) -> None:
    port = hnode.http_port  # type: ignore[attr-defined]
    assert request(port, "/nope")[0] == 404
    status, _, body = request(port, "/api/nope")
    assert status == 404 and "error" in json.loads(body)
    assert request(port, "/api/jobs/explode", {"ids": ["x"]})[0] == 404
    assert request(port, "/static/../../pyproject.toml")[0] == 404
    assert request(port, "/api/queues/never-seen-queue")[0] == 404
    assert request(port, "/api/jobs/D-00000000-000000000000000000000000-0000")[0] == 404
    status, _, body = request(port, "/api/jobs/not-an-id")
    assert status == 400 and json.loads(body)["error"].startswith("BADID")
    # malformed JSON, wrong content type, wrong shapes
    status, _, body = request(port, "/api/jobs/ack", raw=b"{not json")
    assert status == 400 and "malformed JSON" in json.loads(body)["error"]
    assert request(port, "/api/jobs/ack", raw=b'{"ids": ["x"]}',
                   content_type="text/plain")[0] == 400
    assert request(port, "/api/jobs/ack", raw=b"[1, 2]")[0] == 400
    assert request(port, "/api/jobs/ack", {"ids": []})[0] == 400
    assert request(port, "/api/jobs/ack", {"ids": [1, 2]})[0] == 400
    assert request(port, f"/api/queues/{q}/pause", {"state": "sideways"})[0] == 400
    assert request(port, f"/api/queues/{q}?limit=abc")[0] == 400
    assert request(port, "/api/jobs/ack", raw=b"\xff\xfe")[0] == 400
    # huge bodies are refused, and the node is fine
    status, _, _ = request(port, "/api/jobs/ack", raw=b'{"ids": ["' + b"x" * (MAX_BODY * 4)
                           + b'"]}')
    assert status == 413
    with Conn(hnode.port) as c:
        assert c.cmd("PING") == "PONG"


def test_dashboard_is_served_without_external_resources(hnode: DisqueProcess) -> None:
    port = hnode.http_port  # type: ignore[attr-defined]
    status, headers, body = request(port, "/")
    assert status == 200 and b"/static/app.js" in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for name in ("app.js", "app.css"):
        status, _, text = request(port, f"/static/{name}")
        assert status == 200 and text
    static = REPO / "disque" / "http" / "static"
    for f in static.iterdir():
        # (the SVG namespace is a name, not a download)
        text = f.read_text().replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, \
            f"{f.name} loads something from outside"


def test_password_protects_everything(tmp_path: Path) -> None:
    hp = http_port()
    proc = DisqueProcess(tmp_path, args=["--http-port", str(hp), "--requirepass", "resp-pw"])
    proc.start(wait=False)  # (the harness's readiness PING would get -NOAUTH)
    try:
        wait_for(lambda: request(hp, "/metrics", password="resp-pw")[0] == 200, timeout=30,
                 what="the HTTP side")
        for path in ("/", "/metrics", "/api/node"):
            status, headers, _ = request(hp, path)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
        assert request(hp, "/metrics", password="wrong")[0] == 401
        assert request(hp, "/metrics", password="resp-pw")[0] == 200  # requirepass
        with Conn(proc.port) as c:
            assert c.cmd("AUTH", "resp-pw") == "OK"
            assert c.cmd("CONFIG", "SET", "http-password", "web-pw") == "OK"
            assert c.cmd("CONFIG", "GET", "http-password") == [b"http-password", b"******"]
        assert request(hp, "/api/node", password="resp-pw")[0] == 401
        assert request(hp, "/api/node", password="web-pw")[0] == 200
        assert request(hp, "/api/jobs/ack", {"ids": ["x"]})[0] == 401
    finally:
        proc.kill()


def test_config_set_http_port_moves_and_stops_the_listener(tmp_path: Path) -> None:
    proc = DisqueProcess(tmp_path).start()  # no HTTP at start
    try:
        first, second = http_port(), http_port()
        with Conn(proc.port) as c:
            assert c.cmd("CONFIG", "GET", "http-port") == [b"http-port", b"0"]
            assert c.cmd("CONFIG", "SET", "http-port", str(first)) == "OK"
            wait_for(lambda: request(first, "/api/node")[0] == 200, what="HTTP on")
            # a port already taken is refused; the listener stays where it was
            reply = c.cmd("CONFIG", "SET", "http-port", str(proc.port))
            assert isinstance(reply, Err) and "Could not listen on http-port" in reply
            assert c.cmd("CONFIG", "GET", "http-port") == [b"http-port", str(first).encode()]
            assert request(first, "/api/node")[0] == 200
            assert c.cmd("CONFIG", "SET", "http-port", str(second)) == "OK"
            wait_for(lambda: request(second, "/api/node")[0] == 200, what="HTTP moved")
            with pytest.raises(OSError):
                request(first, "/api/node", timeout=2)
            assert c.cmd("CONFIG", "SET", "http-port", "0") == "OK"
            with pytest.raises(OSError):
                request(second, "/api/node", timeout=2)
            assert c.cmd("PING") == "PONG"
    finally:
        proc.kill()


def test_http_port_in_use_at_start_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = DisqueProcess(tmp_path, args=["--http-port", str(port)]).start(wait=False)
        wait_for(lambda: not proc.alive(), timeout=30, what="the server to exit")
    assert proc.proc is not None and proc.proc.returncode == 1
    assert "Could not listen" in proc.output()


# ---------------------------------------------------------------------------- abuse
def test_a_stalled_header_or_body_is_closed_after_its_timeout(tmp_path: Path) -> None:
    """http-idle-timeout closes a connection whose request header never ends, and
    http-body-timeout one whose body never ends (answered 400 first); meanwhile the node
    serves other HTTP and RESP clients. Short timeouts so that the test is short."""
    hp = http_port()
    proc = DisqueProcess(tmp_path, args=["--http-port", str(hp), "--http-idle-timeout", "1",
                                         "--http-body-timeout", "1"]).start()
    stalled: list[socket.socket] = []
    try:
        with Conn(proc.port) as c:
            assert c.cmd("CONFIG", "GET", "http-*-timeout") == [
                b"http-idle-timeout", b"1", b"http-body-timeout", b"1"]
            # read when the HTTP side starts
            assert c.cmd("CONFIG", "SET", "http-idle-timeout", "5") == \
                "ERR Unsupported CONFIG parameter: http-idle-timeout"
        started = time.monotonic()  # before either connection exists on the server
        header = socket.create_connection(("127.0.0.1", hp), timeout=30)
        header.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: no end
        body = socket.create_connection(("127.0.0.1", hp), timeout=30)
        body.sendall(b"POST /api/jobs/ack HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     b'{"ids": [')  # 9 bytes of 100
        stalled += [header, body]
        received = {header: b"", body: b""}
        closed_at: dict[socket.socket, float] = {}
        deadline = time.monotonic() + 60  # a hang guard, not a measure
        while len(closed_at) < 2:
            assert time.monotonic() < deadline, \
                f"still open: {[received[s] for s in stalled if s not in closed_at]}"
            for s in stalled:
                if s in closed_at:
                    continue
                s.settimeout(0.05)
                try:
                    data = s.recv(65536)
                except TimeoutError:
                    continue
                except ConnectionResetError:
                    data = b""
                if data:
                    received[s] += data
                else:
                    closed_at[s] = time.monotonic()
            # the node keeps serving everyone else
            assert request(hp, "/api/node")[0] == 200
            with Conn(proc.port) as c:
                assert c.cmd("PING") == "PONG"
        assert received[header] == b""  # closed without an answer
        head, _, text = received[body].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), received[body]
        assert json.loads(text) == {"error": "the body did not arrive in time"}
        # not before the timeouts (less the loop clock's millisecond granularity)
        assert all(t - started >= 0.99 for t in closed_at.values()), closed_at
    finally:
        for s in stalled:
            s.close()
        proc.kill()


def resp_answers(port: int) -> None:
    """A PING on a fresh RESP connection is answered. The timeout is generous: missing it
    means the loop was blocked (here: until the HTTP side's IDLE_TIMEOUT of 10 s freed it),
    not slow; how fast RESP answers beside HTTP load is for `make bench`."""
    with Conn(port, timeout=10) as c:
        assert c.cmd("PING") == "PONG"


def held_open(s: socket.socket) -> bool:
    """Has the server neither answered nor closed this connection (yet)?"""
    s.setblocking(False)
    try:
        s.recv(1)  # a reply, or b"" for a close
        return False
    except BlockingIOError:
        return True
    except OSError:  # reset
        return False
    finally:
        s.setblocking(True)


def test_slowloris_and_flood_on_http_never_block_resp(hnode: DisqueProcess) -> None:
    port = hnode.http_port  # type: ignore[attr-defined]
    # slowloris: more half-sent requests than the HTTP side accepts, trickling bytes
    slow: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS + 40):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        for s in slow[:50]:
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                pass  # already closed by the server: fine
        resp_answers(hnode.port)
        # ... while the HTTP side still holds the half-sent requests open: RESP was served
        # beside them, not once they timed out
        held = sum(held_open(s) for s in slow[:MAX_CONNECTIONS])
        assert held > 0, "every slow connection was closed before RESP answered"
        # past the cap, a connection is answered 503 and closed at once
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        head = extra.recv(64)
        extra.close()
        assert head.startswith(b"HTTP/1.1 503"), head

        # flood: many clients hammering /metrics and the API at the same time
        stop = threading.Event()
        done = [0]

        def flood() -> None:
            while not stop.is_set():
                try:
                    request(port, "/api/queues", timeout=5)
                    done[0] += 1
                except OSError:
                    pass  # refused past the cap, or timed out: the flood goes on

        for s in slow:  # free the slots for the flood
            s.close()
        slow.clear()
        flooders = [Background(flood) for _ in range(8)]
        try:
            wait_for(lambda: done[0] >= 20, timeout=30, what="the flood to get through")
            for _ in range(20):
                resp_answers(hnode.port)
            # the HTTP side kept serving the flood meanwhile
            before = done[0]
            wait_for(lambda: done[0] > before, timeout=30, what="the flood to go on")
        finally:
            stop.set()
        for t in flooders:
            t.result(timeout=30)
    finally:
        for s in slow:
            s.close()
    assert request(port, "/api/node")[0] == 200
