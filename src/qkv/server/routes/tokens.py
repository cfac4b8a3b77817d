"""POST /tokenize and /detokenize: token ids of a text and the text of token ids (vLLM's shapes), in a worker
thread (tokenizing is no model work)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from qkv.server.routes.common import ServiceDep
from qkv.server.schemas import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse

router = APIRouter()


@router.post("/tokenize", response_model=TokenizeResponse, response_model_exclude_none=True)
async def tokenize(body: TokenizeRequest, service: ServiceDep) -> TokenizeResponse:
    return await run_in_threadpool(service.tokenize, body)


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, service: ServiceDep) -> DetokenizeResponse:
    return await run_in_threadpool(service.detokenize, body)
