"""The dashboard in a real browser: Playwright driving the system's Chromium against a gateway in front of the
emulator, with traffic from two tenants. Under CI=true a missing browser fails this test; elsewhere it is skipped
(`scripts/setup-chromium.sh` installs it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.processes import serve

from fairserve.api.server import running_server
from fairserve.gateway import build_config, create_app

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("FAIRSERVE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OUT = Path(os.environ.get("FAIRSERVE_TEST_OUTPUT", Path(__file__).resolve().parents[1] / "build" / "test-output"))
ADMIN, KEYS = "adm-secret-key", {"alice": "ka", "bob": "kb"}


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM} (scripts/setup-chromium.sh installs Debian's chromium)"
    return None


@pytest.fixture(scope="module")
def browser():
    why = _missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests need a browser under CI: {why}", pytrace=False)
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def traffic(url: str, per_tenant: int = 6, keys: tuple[str, ...] = tuple(KEYS.values())) -> Iterator[None]:
    """Each tenant keeps `per_tenant` streaming requests open (more than the backend takes) until the block ends."""
    stop = threading.Event()

    async def tenant_loop(key: str) -> None:
        body = {"model": "m", "prompt": "hello " * 20, "max_tokens": 40, "stream": True, "ignore_eos": True}
        async with httpx.AsyncClient(timeout=30) as client:

            async def one() -> None:
                while not stop.is_set():
                    with contextlib.suppress(httpx.HTTPError):
                        async with client.stream(
                            "POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                        ) as r:
                            async for _ in r.aiter_bytes():
                                pass

            await asyncio.gather(*(one() for _ in range(per_tenant)))

    async def main() -> None:
        await asyncio.gather(*(tenant_loop(k) for k in keys))

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


@pytest.fixture(scope="module")
def emulator():
    with serve("emulate", "--time-scale", "10") as backend:
        yield backend


@pytest.fixture(scope="module")
def gateway(emulator):
    cfg = build_config(
        {
            "backends": [{"url": emulator, "max_inflight_requests": 4}],
            "admin_key": ADMIN,
            "tenants": [
                {"name": "alice", "api_keys": [KEYS["alice"]], "weight": 2, "rate": {"requests": 10**6}},
                {"name": "bob", "api_keys": [KEYS["bob"]], "quota": {"tokens": 10**9, "per": "day"}},
            ],
        }
    )
    with running_server(create_app(cfg)) as url:
        yield url


def test_dashboard_live_in_a_browser(browser, gateway):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    with traffic(gateway):
        page.goto(gateway + "/dashboard")
        assert "alice" not in page.content() and page.locator("#board").is_hidden()  # no data without the key

        for wrong, shown in [("not-the-key", "Refused"), (KEYS["alice"], "tenant's key")]:
            page.fill("#key", wrong)
            page.click("#login button[type=submit]")
            # NOTE: waits for this key's refusal: the one of the key before must not pass for it
            page.wait_for_function(
                "(s) => { const e = document.querySelector('#error'); return !e.hidden && e.textContent.includes(s); }",
                arg=shown,
            )
            assert page.locator("#board").is_hidden()

        page.fill("#key", ADMIN)
        page.click("#login button[type=submit]")
        for tenant in KEYS:
            page.wait_for_selector(f'#tenants tr[data-tenant="{tenant}"]', timeout=10_000)
        assert page.inner_text('#tenants tr[data-tenant="alice"] [data-field="weight"]') == "2"
        assert page.locator('#backends tr [data-field="healthy"]').inner_text() == "healthy"

        cell = '#tenants tr[data-tenant="{}"] [data-field="service"]'
        before = {t: page.inner_text(cell.format(t)) for t in KEYS}
        page.wait_for_function(
            "([sel, old]) => document.querySelector(sel).textContent !== old",
            arg=[cell.format("alice"), before["alice"]],
            timeout=10_000,
        )
        page.wait_for_function(
            "([sel, old]) => document.querySelector(sel).textContent !== old",
            arg=[cell.format("bob"), before["bob"]],
            timeout=10_000,
        )
        for tenant in KEYS:  # one line per tenant on the chart once two samples give a rate
            page.wait_for_selector(f'#chart path[data-tenant="{tenant}"]', timeout=10_000)
        page.wait_for_function(
            "() => Number(document.querySelector("
            '\'#tenants tr[data-tenant="alice"] [data-field="rate"]\').textContent'
            ".replace(/,/g, '')) > 0",
            timeout=10_000,
        )
        # bob's quota: what finished requests used, what running ones hold, and what remains, as they happen
        quota = '#quotas tr[data-node="bob"][data-measure="tokens"] [data-field="{}"]'
        page.wait_for_function(
            "(sel) => Number(document.querySelector(sel).textContent.replace(/,/g, '')) > 0",
            arg=quota.format("used"),
            timeout=10_000,
        )
        used, held, remaining = (
            int(page.inner_text(quota.format(f)).replace(",", "")) for f in ("used", "held", "remaining")
        )
        assert abs(used + held + remaining - 10**9) <= 2  # one poll's numbers (rounded for display)
        assert page.locator('#quotas tr[data-node="alice"]').count() == 0  # alice has no quota
        # alice's rate cap: the requests counted this minute, and what remains of it
        rate = '#rates tr[data-node="alice"][data-measure="requests"] [data-field="{}"]'
        page.wait_for_function(
            "(sel) => Number(document.querySelector(sel).textContent.replace(/,/g, '')) > 0",
            arg=rate.format("used"),
            timeout=10_000,
        )
        # NOTE: both cells in one evaluation: one poll's numbers (the page cannot repaint between them)
        counted, left = page.evaluate(
            "(sels) => sels.map((s) => Number(document.querySelector(s).textContent.replace(/,/g, '')))",
            [rate.format("used"), rate.format("remaining")],
        )
        assert counted > 0 and counted + left == 10**6, (counted, left)
        assert page.locator('#rates tr[data-node="bob"]').count() == 0  # bob has no cap
        OUT.mkdir(parents=True, exist_ok=True)
        shot = OUT / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert not any(ADMIN in u or KEYS["alice"] in u for u in requested)  # the key never goes in a URL
    assert missing == []  # not even a favicon
    page.close()


TREE_KEYS = {"premium/acme/search": "k-s", "premium/acme/chat": "k-c", "premium/globex/api": "k-g", "free/ann": "k-f"}


@pytest.fixture(scope="module")
def tree_gateway(emulator):
    cfg = build_config(
        {
            "backends": [{"url": emulator, "max_inflight_requests": 4}],
            "admin_key": ADMIN,
            "groups": [
                {"name": "premium", "priority": 0},
                {"name": "premium/acme", "weight": 2},
                {"name": "free", "priority": 1},
            ],
            "tenants": [{"name": t, "api_keys": [k]} for t, k in TREE_KEYS.items()],
        }
    )
    with running_server(create_app(cfg)) as url:
        yield url


def test_dashboard_shows_a_three_level_tree_and_a_live_reweight(browser, tree_gateway):
    page = browser.new_page(viewport={"width": 1200, "height": 1000})
    row = '#tree tr[data-node="{}"] [data-field="{}"]'
    with traffic(tree_gateway, per_tenant=3, keys=tuple(TREE_KEYS.values())):
        page.goto(tree_gateway + "/dashboard")
        page.fill("#key", ADMIN)
        page.click("#login button[type=submit]")
        for path in ("premium", "premium/acme", "premium/acme/search", "premium/globex/api", "free", "free/ann"):
            page.wait_for_selector(f'#tree tr[data-node="{path}"]', timeout=10_000)
        # each node's share, counter, queued and in-flight counts, with members under their groups
        order = page.eval_on_selector_all("#tree tbody tr", "rows => rows.map(r => r.dataset.node)")
        assert order == [
            "premium",
            "premium/acme",
            "premium/acme/search",
            "premium/acme/chat",
            "premium/globex",
            "premium/globex/api",
            "free",
            "free/ann",
        ]
        assert page.inner_text(row.format("premium/acme", "weight")) == "2"
        assert page.inner_text(row.format("free", "priority")) == "1"
        # premium (priority 0) is backlogged, so it gets the service and free waits; acme twice globex's share
        page.wait_for_function(
            "(sel) => parseFloat(document.querySelector(sel).textContent) > 0",
            arg=row.format("premium/acme", "counter"),
            timeout=10_000,
        )
        page.wait_for_function(
            "(sel) => Number(document.querySelector(sel).textContent) > 0",
            arg=row.format("free/ann", "queue_length"),
            timeout=10_000,
        )
        for path in ("premium", "premium/acme", "free/ann"):
            for field in ("share", "counter", "queue_length", "in_flight"):
                assert page.inner_text(row.format(path, field)) != "", (path, field)
        assert page.inner_text(row.format("premium", "share")).endswith("%")

        # a live reweight from the page: the form PUTs the node's weight, and the next poll shows it
        page.fill("#node-path", "premium/globex")
        page.fill("#node-weight", "4")
        page.click("#reweight button[type=submit]")
        page.wait_for_function(
            "(sel) => document.querySelector(sel).textContent === '4'",
            arg=row.format("premium/globex", "weight"),
            timeout=10_000,
        )
        assert "premium/globex: weight 4" in page.inner_text("#reweight-status")
        page.fill("#node-path", "premium/nope")
        page.click("#reweight button[type=submit]")
        page.wait_for_function("() => document.querySelector('#reweight-status').textContent.includes('refused')")
        OUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUT / "dashboard-tree.png"), full_page=True)
    page.close()
    doc = httpx.get(tree_gateway + "/admin/tree", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    premium = doc["tree"][0]
    assert [c["weight"] for c in premium["children"]] == [2, 4]  # the reweight reached the gateway


def test_dashboard_lists_the_keys_made_by_api_and_drops_a_revoked_one(browser, emulator, tmp_path):
    cfg = build_config(
        {
            "backends": [{"url": emulator}],
            "admin_key": ADMIN,
            "tenants": [{"name": t, "api_keys": [k]} for t, k in KEYS.items()],
            "snapshot": str(tmp_path / "snap.json"),  # NOTE: the API's keys are kept beside it
        }
    )
    admin = {"Authorization": f"Bearer {ADMIN}"}
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    with running_server(create_app(cfg)) as url, httpx.Client(timeout=10) as http:
        ci = http.post(url + "/admin/keys", json={"tenant": "alice", "name": "ci"}, headers=admin).json()
        batch = http.post(url + "/admin/keys", json={"tenant": "bob", "expires_in_s": 3600}, headers=admin).json()
        assert http.get(url + "/v1/models", headers={"Authorization": f"Bearer {ci['key']}"}).status_code == 200
        page.goto(url + "/dashboard")
        page.fill("#key", ADMIN)
        page.click("#login button[type=submit]")
        row = '#keys tr[data-key="{}"] [data-field="{}"]'
        page.wait_for_selector(f'#keys tr[data-key="{batch["id"]}"]', timeout=10_000)
        assert page.inner_text(row.format(ci["id"], "name")) == "ci"
        assert page.inner_text(row.format(ci["id"], "prefix")) == ci["prefix"] + "…"
        assert page.inner_text(row.format(ci["id"], "tenant")) == "alice"
        assert page.inner_text(row.format(ci["id"], "last_used_at")) != "–"  # used once
        assert page.inner_text(row.format(batch["id"], "last_used_at")) == "–"  # never used
        assert page.inner_text(row.format(batch["id"], "expires_at")) != "–"
        assert page.inner_text(row.format(batch["id"], "state")) == "active"
        assert ci["key"] not in page.content() and batch["key"] not in page.content()  # never a key
        assert http.delete(f"{url}/admin/keys/{batch['id']}", headers=admin).status_code == 200
        page.wait_for_selector(f'#keys tr[data-key="{batch["id"]}"]', state="detached", timeout=5_000)
        assert page.locator("#keys tbody tr").count() == 1
    page.close()
