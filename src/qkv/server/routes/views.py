"""POST /v1/next-token, /v1/attention and /v1/walkthrough: the analysis views, one forward pass each, on the
model thread behind their own gate (so the playground's chart keeps updating while a generation streams)."""

from __future__ import annotations

from fastapi import APIRouter

from qkv.server.analyses import attention_view, next_token_view, walkthrough_view
from qkv.server.routes.common import ServiceDep, gated
from qkv.server.schemas import (
    AttentionRequest,
    AttentionResponse,
    NextTokenRequest,
    NextTokenResponse,
    WalkthroughRequest,
)

router = APIRouter()


@router.post("/v1/next-token", response_model=NextTokenResponse)
async def next_token(body: NextTokenRequest, service: ServiceDep) -> NextTokenResponse:
    service.require("/v1/next-token")
    return await gated(service.analyses, service.model_thread, next_token_view, service.bundle, service.limits, body)


@router.post("/v1/attention", response_model=AttentionResponse)
async def attention(body: AttentionRequest, service: ServiceDep) -> AttentionResponse:
    service.require("/v1/attention")
    return await gated(service.analyses, service.model_thread, attention_view, service.bundle, service.limits, body)


@router.post("/v1/walkthrough")
async def walkthrough(body: WalkthroughRequest, service: ServiceDep) -> dict:
    service.require("/v1/walkthrough")
    work = (walkthrough_view, service.bundle, service.limits, body, service.name)
    return await gated(service.analyses, service.model_thread, *work)
