"""The HTTP service: ``POST /score``, ``GET /models``, ``/metrics``, ``/healthz``.

Every refusal is a 4xx or 503 with ``{"error": "<one line>"}`` and is counted
by reason; nothing reaches the client as a traceback:

- 400 ``malformed JSON`` / 422 ``invalid request`` (a field missing or of
  the wrong type, an unknown domain or surface), 413 ``too many
  candidates`` (over ``max_candidates``);
- 404 ``unknown ads`` (no ``ad_profile`` row online) and ``unknown model``;
- 503 ``no model yet`` (the folder has no loadable version), ``feature view
  missing`` (not registered) and ``online store unavailable``.

An unknown user is served (a cold start: profile ids 0, zero counters, an
empty history) and flagged ``cold_start`` in the response.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from features.serving_artifacts import GEM_MODEL, student_model
from features.vocab import DOMAINS, SURFACES
from serving.inputs import request_inputs
from serving.metrics import ServingMetrics
from serving.models import Models
from serving.online import (
    AD_VIEWS,
    ADVERTISER_VIEWS,
    USER_VIEWS,
    FeatureViewMissingError,
    OnlineFeatures,
)
from serving.schema import AdScore, ErrorResponse, ScoreRequest, ScoreResponse

log = logging.getLogger(__name__)


class RefusedError(Exception):
    """A request answered with ``status`` and a one-line reason."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


def model_name(request: ScoreRequest) -> str:
    """The model folder a request asks for."""
    if request.model in (None, "student"):
        return student_model(request.domain)
    if request.model == GEM_MODEL:
        return GEM_MODEL
    raise RefusedError(404, "unknown model", f"unknown model {request.model!r}")


def _check(request: ScoreRequest, max_candidates: int) -> None:
    if request.domain not in DOMAINS:
        raise RefusedError(422, "invalid request", f"unknown domain {request.domain!r}")
    if request.surface not in SURFACES:
        raise RefusedError(
            422, "invalid request", f"unknown surface {request.surface!r}"
        )
    if len(request.ad_ids) > max_candidates:
        raise RefusedError(
            413,
            "too many candidates",
            f"{len(request.ad_ids)} candidates, at most {max_candidates}",
        )


def score(
    request: ScoreRequest, models: Models, online: OnlineFeatures, max_candidates: int
) -> ScoreResponse:
    """Score one request (raises :class:`RefusedError`)."""
    _check(request, max_candidates)
    name = model_name(request)
    loaded = models.get(name)
    if loaded is None:
        raise RefusedError(503, "no model yet", f"no loadable version of {name} yet")
    now_ms = request.request_time_ms or int(time.time() * 1000)
    try:
        user = online.read(USER_VIEWS, "user_id", [request.user_id])
        ads = online.read(AD_VIEWS, "ad_id", request.ad_ids)
        unknown = [
            a
            for a, r in zip(request.ad_ids, ads.values, strict=True)
            if not r["ad_profile"]
        ]
        if unknown:
            raise RefusedError(404, "unknown ads", f"unknown ads {unknown[:10]}")
        advertiser_ids = [int(r["ad_profile"]["advertiser_id"]) for r in ads.values]
        advertisers = online.read(ADVERTISER_VIEWS, "advertiser_id", advertiser_ids)
    except FeatureViewMissingError as error:
        raise RefusedError(503, "feature view missing", str(error)) from error
    except RefusedError:
        raise
    except Exception as error:  # the store itself: Redis down, SQLite locked
        log.warning("online store read failed: %r", error)
        raise RefusedError(
            503, "online store unavailable", f"online store: {type(error).__name__}"
        ) from error
    cold = all(v is None for v in user.values[0].values())
    inputs = request_inputs(
        user_id=request.user_id,
        user=user.values[0],
        ad_ids=request.ad_ids,
        ads=ads.values,
        advertisers=advertisers.values,
        domain=request.domain,
        surface=request.surface,
        request_ms=now_ms,
        max_seq_len=loaded.manifest.max_seq_len,
    )
    probabilities = loaded.score(inputs)
    newest = [t for t in (user.newest_ms, ads.newest_ms, advertisers.newest_ms) if t]
    return ScoreResponse(
        scores=[
            AdScore(ad_id=a, click=float(p[0]), conversion=float(p[1]))
            for a, p in zip(
                request.ad_ids, np.asarray(probabilities, dtype=np.float64), strict=True
            )
        ],
        model=name,
        model_version=loaded.version,
        feature_age_ms=now_ms - max(newest) if newest else None,
        cold_start=cold,
        request_time_ms=now_ms,
    )


def create_app(
    models: Models, online: OnlineFeatures, *, max_candidates: int = 500
) -> FastAPI:
    """The FastAPI application over loaded models and the online store."""
    app = FastAPI(title="GEM ads scoring", version="1")
    metrics = ServingMetrics(models.describe)

    def refuse(status: int, reason: str, detail: str) -> JSONResponse:
        metrics.requests.labels(str(status), reason).inc()
        return JSONResponse(status_code=status, content={"error": detail})

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        if first.get("type") == "json_invalid":
            return refuse(
                400, "malformed JSON", "malformed JSON: " + first.get("msg", "")
            )
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return refuse(422, "invalid request", f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(
        _request: Request, error: StarletteHTTPException
    ) -> JSONResponse:
        return refuse(error.status_code, "http", str(error.detail))

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, error: Exception) -> JSONResponse:
        log.error("request failed: %r", error)
        return refuse(500, "internal", f"internal error: {type(error).__name__}")

    @app.post(
        "/score",
        response_model=ScoreResponse,
        responses={s: {"model": ErrorResponse} for s in (400, 404, 413, 422, 503)},
    )
    def score_route(request: ScoreRequest) -> Any:
        started = time.perf_counter()
        try:
            response = score(request, models, online, max_candidates)
        except RefusedError as refused:
            return refuse(refused.status, refused.reason, refused.detail)
        metrics.latency.observe(time.perf_counter() - started)
        metrics.requests.labels(
            "200", "cold start" if response.cold_start else "ok"
        ).inc()
        if response.feature_age_ms is not None:
            metrics.feature_age.observe(response.feature_age_ms / 1000)
        return response

    @app.get("/models")
    def models_route() -> dict[str, Any]:
        return models.describe()

    @app.get("/healthz")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics_route() -> Response:
        metrics.refresh_models()
        return Response(
            generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    return app
