"""What the server is: GET /health, /metrics, /v1/model, /v1/models (and /v1/models/{id}), and the playground."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, PlainTextResponse

from qkv.server.routes.common import ServiceDep
from qkv.server.schemas import ModelInfo
from qkv.server.service import Service

STATIC = Path(__file__).parent.parent / "static"
STARTED = int(time.time())

router = APIRouter()


@router.get("/health")
async def health(service: ServiceDep) -> dict:
    scheduler = service.scheduler
    return {
        "status": "ok",
        "model": service.name,
        "kind": service.kind,
        "scheduler": None if scheduler is None else scheduler.name,
        "active_generations": service.generations.active if scheduler is None else scheduler.running(),
        "max_concurrent": service.limits.max_concurrent,
    }


@router.get("/metrics", include_in_schema=False)
async def metrics(service: ServiceDep) -> PlainTextResponse:
    """Prometheus' text format (qkv.server.metrics)."""
    return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/model", response_model=ModelInfo)
async def model_info(service: ServiceDep) -> ModelInfo:
    return service.info()


def _card(service: Service) -> dict:
    return {"id": service.name, "object": "model", "created": STARTED, "owned_by": "qkv"}


@router.get("/v1/models")
async def models(service: ServiceDep) -> dict:
    return {"object": "list", "data": [_card(service)]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, service: ServiceDep) -> dict:
    service.check_model(model_id)
    return _card(service)


@router.get("/", include_in_schema=False)
async def playground() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})
