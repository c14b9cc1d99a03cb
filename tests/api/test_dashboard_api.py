"""The reads the dashboard polls: a page of operations knows its place (``offset``,
``limit``, ``total`` of what the filter selects), and the list, an operation and its
events answer with an ``ETag`` that ``If-None-Match`` turns into ``304`` until the
database changes. Over the demo's real history, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient

from controlplane.engine.decider import Event
from controlplane.store import queries
from tests.support.api_world import History, add_running_migration, advance, auth

Client = TestClient[web.Request, web.Application]


async def test_pages_of_the_list_cover_it_once_with_the_total(
        client: Client, history: History) -> None:
    everything = await queries.list_machines(history.db, queries.MachineFilter())
    seen: list[str] = []
    for offset in range(0, len(everything) + 2, 2):
        page = await (await client.get(f"/api/v1/operations?limit=2&offset={offset}",
                                       headers=auth())).json()
        assert (page["limit"], page["offset"], page["total"]) == (2, offset, len(everything))
        seen += [op["id"] for op in page["operations"]]
    assert seen == [m.id for m in everything]


async def test_the_total_counts_what_the_filter_selects_not_the_page(
        client: Client, history: History) -> None:
    page = await (await client.get("/api/v1/operations?kind=migration&limit=1",
                                   headers=auth())).json()
    assert page["total"] == 1
    assert [op["id"] for op in page["operations"]] == [history.migration_id]
    none = await (await client.get("/api/v1/operations?phase=Nowhere", headers=auth())).json()
    assert (none["total"], none["operations"]) == (0, [])


async def test_a_bad_offset_is_refused_naming_it(client: Client) -> None:
    for bad in ("-1", "x", "1000001", "1.5"):
        response = await client.get(f"/api/v1/operations?offset={bad}", headers=auth())
        assert response.status == 400, bad
        assert (await response.json())["parameter"] == "offset"


async def test_sort_orders_every_page_and_pages_still_cover_the_list_once(
        client: Client, history: History) -> None:
    everything = await queries.list_machines(history.db, queries.MachineFilter())
    for sort, key, reverse in (("kind", "kind", False), ("-phase", "phase", True)):
        seen: list[dict[str, str]] = []
        for offset in range(0, len(everything), 2):
            page = await (await client.get(
                f"/api/v1/operations?limit=2&offset={offset}&sort={sort}",
                headers=auth())).json()
            assert page["sort"] == sort
            seen += page["operations"]
        assert sorted(op["id"] for op in seen) == sorted(m.id for m in everything)
        values = [op[key] for op in seen]
        assert values == sorted(values, reverse=reverse), (sort, values)


async def test_a_bad_sort_is_refused_naming_it(client: Client) -> None:
    for bad in ("took", "created", "--kind", "spec"):
        response = await client.get(f"/api/v1/operations?sort={bad}", headers=auth())
        assert response.status == 400, bad
        assert (await response.json())["parameter"] == "sort"


async def test_an_unchanged_read_is_304_and_a_change_gives_a_new_etag(
        client: Client, history: History) -> None:
    await add_running_migration(history.db, "live-1")
    paths = ("/api/v1/operations", "/api/v1/operations/live-1",
             "/api/v1/operations/live-1/events")
    first = {}
    for path in paths:
        response = await client.get(path, headers=auth())
        assert response.status == 200
        first[path] = response.headers["ETag"]
        again = await client.get(path, headers={**auth(), "If-None-Match": first[path]})
        assert again.status == 304, path
        assert await again.read() == b""
        assert again.headers["ETag"] == first[path]
    await advance(history.db, "live-1", "Checkpointing", Event("CaptureRequested", {}))
    for path in paths:
        response = await client.get(path, headers={**auth(), "If-None-Match": first[path]})
        assert response.status == 200, path
        assert response.headers["ETag"] != first[path]
    events = await (await client.get(paths[2], headers=auth())).json()
    assert [e["type"] for e in events["events"]][-1] == "CaptureRequested"


async def test_an_etag_of_another_read_does_not_match(client: Client, history: History) -> None:
    listed = await client.get("/api/v1/operations", headers=auth())
    other = await client.get(f"/api/v1/operations/{history.migration_id}",
                             headers={**auth(), "If-None-Match": listed.headers["ETag"]})
    assert other.status == 200
