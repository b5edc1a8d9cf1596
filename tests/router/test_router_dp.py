"""``radixrt serve --dp 2`` live: two real radixrt servers as Ray Serve replicas behind the routing policy.

One server for the module (Ray, the ingress and two SmolLM2 replicas take minutes to start on 2 cores).
The cache-aware vs round-robin comparison swaps the policy at run time (``POST /router/policy``) and
reads the replicas' own radix-cache counters (``GET /router/stats``).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time

import pytest

from server_util import ServerProc

pytest.importorskip("ray.serve", reason="Ray Serve is the [cluster] extra; `make test` installs it")
# the module's server starts inside its first test's limit: Ray and two replicas can take over the default
# 300 s on a loaded 2-core box, and the fixture's own bounds (600 s + 240 s) stay under this one
pytestmark = pytest.mark.timeout(900)

TENANTS = [
    f"You are assistant number {i} of the Example company. "
    + " ".join(f"Rule {j}: answer tenant {i}'s customers politely, briefly and in English." for j in range(8))
    for i in range(4)
]


@pytest.fixture(scope="module")
def dp():
    s = ServerProc("--dp", "2", "--max-running-requests", "8")
    try:
        s.wait_ready(timeout=600)
        _wait_both_replicas(s)
    except BaseException:
        s.kill()
        raise
    yield s
    s.stop(timeout=90)


def _gen(c, text: str, n: int = 2, **sp):
    return c.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, **sp}})


def _wait_both_replicas(s, timeout: float = 240) -> None:
    """/health is up with one replica, and Ray restarts a killed one later; the tests want both."""
    deadline = time.time() + timeout
    while len(_stats_of(s)) < 2:
        assert time.time() < deadline, s.logs()
        time.sleep(1)


def _stats_of(s) -> dict:
    with s.client(timeout=60) as c:
        return _stats(c)


def _stats(c) -> dict:
    st = c.get("/router/stats").json()
    return {r["replica"]: r for r in st["replicas"]}


def _run_tenants(c) -> tuple[int, int, dict]:
    """Tenant-major, one request at a time: 3 questions per tenant. Returns hit and query tokens summed
    over the replicas, and tenant -> replicas that served it."""
    served: dict[int, list[str]] = {}
    for t, sys_prompt in enumerate(TENANTS):
        for q in range(3):
            r = _gen(c, f"{sys_prompt}\nQuestion {q}: how do I reset my password?")
            assert r.status_code == 200, r.text
            served.setdefault(t, []).append(r.headers["x-radixrt-replica"])
    st = _stats(c)
    assert len(st) == 2, st
    return (
        sum(r["cache"]["hit_tokens"] for r in st.values()),
        sum(r["cache"]["query_tokens"] for r in st.values()),
        served,
    )


def test_cache_aware_beats_round_robin_on_real_replicas(dp):
    _wait_both_replicas(dp)  # test_replica_killed_mid_run may have run first
    with dp.client(timeout=300) as c:
        bad = c.post("/router/policy", json={"policy": "nope"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "policy"
        results = {}
        for policy in ("cache_aware", "round_robin"):
            assert c.post("/router/policy", json={"policy": policy, "flush": True}).json() == {"policy": policy}
            before = _stats(c)
            hits, queries, served = _run_tenants(c)
            hits -= sum(r["cache"]["hit_tokens"] for r in before.values())
            queries -= sum(r["cache"]["query_tokens"] for r in before.values())
            results[policy] = (hits, queries, served)
        ca_hits, ca_q, ca_served = results["cache_aware"]
        rr_hits, rr_q, rr_served = results["round_robin"]
        assert ca_q == rr_q  # the same prompts
        # cache-aware: each tenant stays on one replica, so its 2nd and 3rd questions hit its system prompt;
        # round-robin alternates replicas, so only the 3rd question of each tenant hits
        assert all(len(set(v)) == 1 for v in ca_served.values()), ca_served
        assert all(v[0] != v[1] and v[0] == v[2] for v in rr_served.values()), rr_served
        assert ca_hits >= 1.8 * rr_hits > 0, (ca_hits, rr_hits)
        print(f"\nlive 2 replicas, hit rate: cache_aware {ca_hits / ca_q:.3f}, round_robin {rr_hits / rr_q:.3f}")


def test_replica_killed_mid_run(dp):
    with dp.client(timeout=600) as c:
        c.post("/router/policy", json={"policy": "round_robin"})
        st = _stats(c)
        pool = cf.ThreadPoolExecutor(6)
        # long generations on both replicas (round-robin alternates them)
        futs = [pool.submit(_gen, c, f"Count slowly, request {i}:", 64, ignore_eos=True) for i in range(4)]
        deadline = time.time() + 300
        while not all(r["num_running"] > 0 for r in _stats(c).values()):
            assert time.time() < deadline, "the long requests never started on both replicas"
            time.sleep(0.5)
        victim, survivor = sorted(st)
        os.kill(st[victim]["pid"], signal.SIGKILL)
        outs = [f.result() for f in futs]
        codes = sorted(r.status_code for r in outs)
        assert codes == [200, 200, 503, 503], [(r.status_code, r.text[:200]) for r in outs]
        for r in outs:
            if r.status_code == 503:
                err = r.json()["error"]
                assert "replica serving this request died" in err["message"] and err["type"] == "service_unavailable"
            else:
                assert r.headers["x-radixrt-replica"] == survivor and len(r.json()["output_ids"]) == 64
        # the rest keep being served, by the survivor (Ray Serve restarts the victim in the background)
        after = [_gen(c, f"after the kill {i}") for i in range(4)]
        assert [r.status_code for r in after] == [200] * 4, [r.text[:200] for r in after]
        assert all(r.headers["x-radixrt-replica"] != victim for r in after)
        deadline = time.time() + 30
        while _pid_alive(st[victim]["server_pid"]):  # the victim's server went down with it
            assert time.time() < deadline, "the killed replica's radixrt server survived it"
            time.sleep(0.5)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
