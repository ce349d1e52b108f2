"""The datasets through the admin API (the console's datasets page).

- ``GET /admin/datasets``: every dataset — the global ones and those sent in chats (``owner``:
  the conversation's session) — with its rows, columns and source
- ``GET /admin/datasets/{name}/preview?limit=20``: its first rows (read-only SQL, sandboxed
  like every query: runtime/data)
- ``PUT /admin/datasets/{name}?format=csv``: the raw file as the body (CSV, TSV, Parquet, JSON,
  NDJSON; at most ``data.max_upload_mb``) loaded as a global dataset of that name, replacing
  one; what cannot be read is refused (422) and nothing changes
- ``DELETE /admin/datasets/{name}``: a global dataset removed
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from pluto.gateway.console.access import AUDIT
from pluto.gateway.http.server import GATEWAY_KEY

NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,62}")
FORMATS = {"csv": ".csv", "tsv": ".tsv", "parquet": ".parquet", "json": ".json",
           "ndjson": ".ndjson"}


def _info(d: Any) -> dict[str, Any]:
    return {"name": d.name, "source": d.source, "owner": d.owner, "rows": d.rows,
            "columns": [{"name": c.name, "type": c.type} for c in d.columns],
            "created_at": d.created_at.timestamp(), "size_bytes": d.size_bytes}


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not NAME_RE.fullmatch(name):
        raise web.HTTPBadRequest(text='{"error": "a dataset name is a-z, 0-9 and _ (starting '
                                 'with a letter, at most 63)"}', content_type="application/json")
    return name


async def list_datasets(request: web.Request) -> web.Response:
    service = request.app[GATEWAY_KEY].data.service
    found = await service.visible(None)
    return web.json_response({"datasets": [_info(d) for d in found]})


async def preview(request: web.Request) -> web.Response:
    from pluto.runtime.data.ingest import DatasetError

    service = request.app[GATEWAY_KEY].data.service
    name = _name(request)
    try:
        limit = max(1, min(200, int(request.query.get("limit", "20"))))
    except ValueError:
        return web.json_response({"error": "limit must be a whole number"}, status=400)
    try:
        await service.get(name, None)
        result = await service.query(f'SELECT * FROM "{name}" LIMIT {limit}', None,
                                     max_rows=limit)
    except DatasetError as e:
        return web.json_response({"error": str(e)}, status=404)
    return web.json_response({"name": name, "columns": list(result.columns),
                              "types": list(result.column_types),
                              "rows": [list(r) for r in result.rows]},
                             dumps=lambda o: __import__("json").dumps(o, default=str))


async def put_dataset(request: web.Request) -> web.Response:
    from pluto.runtime.data.child import DataError
    from pluto.runtime.data.ingest import human_size

    gw = request.app[GATEWAY_KEY]
    name = _name(request)
    suffix = FORMATS.get(request.query.get("format", "csv").lower())
    if suffix is None:
        return web.json_response({"error": f"format is one of {', '.join(FORMATS)}"},
                                 status=400)
    limit = int(gw.config.data.max_upload_mb * 1024 * 1024)
    folder = Path(tempfile.mkdtemp(prefix="pluto-upload-"))
    path = folder / f"{name}{suffix}"
    size = 0
    try:
        with path.open("wb") as out:
            async for chunk in request.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > limit:
                    return web.json_response({"error": f"the file is over "
                                              f"{human_size(limit)}"}, status=413)
                await asyncio.to_thread(out.write, chunk)
        if size == 0:
            return web.json_response({"error": "the body is empty: send the file"}, status=400)
        service = gw.data.service
        warehouse = await service.synced(None)
        try:
            info = await asyncio.to_thread(warehouse.ingest, path, name, replace=True)
        except DataError as e:
            return web.json_response({"error": str(e)}, status=422)
        if service.files.shared:
            info = await service._share_dataset(info)  # (every instance can query it)
    finally:
        await asyncio.to_thread(shutil.rmtree, folder, True)
    request[AUDIT] = (f"dataset {name}", f"loaded from {size} bytes of {suffix[1:]}: "
                      f"{info.rows} rows, {len(info.columns)} columns")
    return web.json_response(_info(info), status=201)


async def delete_dataset(request: web.Request) -> web.Response:
    from pluto.runtime.data.ingest import DatasetError

    service = request.app[GATEWAY_KEY].data.service
    name = _name(request)
    try:
        found = await service.get(name, None)
        if found.owner is not None:
            return web.json_response({"error": "this dataset belongs to a conversation; only "
                                      "global datasets are removed here"}, status=409)
        await service.remove(name, None)
    except DatasetError as e:
        return web.json_response({"error": str(e)}, status=404)
    request[AUDIT] = (f"dataset {name}", "removed")
    return web.Response(status=204)


def add_dataset_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/datasets", list_datasets)
    r.add_get("/datasets/{name}/preview", preview)
    r.add_put("/datasets/{name}", put_dataset)
    r.add_delete("/datasets/{name}", delete_dataset)
