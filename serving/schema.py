"""The HTTP API's request and response bodies (FastAPI publishes them as
OpenAPI at ``/openapi.json`` and ``/docs``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from features.vocab import DOMAINS, SURFACES


class ScoreRequest(BaseModel):
    """One ad request: a user on a surface of a domain, and the candidate ads."""

    model_config = ConfigDict(extra="forbid")

    user_id: int = Field(ge=0, description="the user")
    domain: str = Field(description=f"the app, one of {', '.join(DOMAINS)}")
    surface: str = Field(description=f"the surface, one of {', '.join(SURFACES)}")
    ad_ids: list[int] = Field(min_length=1, description="candidate ads")
    request_time_ms: int | None = Field(
        default=None, ge=0, description="epoch ms of the request (default: now)"
    )
    model: str | None = Field(
        default=None,
        description="'gem' or 'student' (default: the domain's student)",
    )


class AdScore(BaseModel):
    """One candidate's calibrated probabilities."""

    ad_id: int
    click: float
    conversion: float


class ScoreResponse(BaseModel):
    """The scores, in the request's candidate order."""

    scores: list[AdScore]
    model: str = Field(description="the model folder that scored")
    model_version: str
    feature_age_ms: int | None = Field(
        description="request time minus the time of the newest feature row used"
    )
    cold_start: bool = Field(
        description="the user has no online features: defaults were used"
    )
    request_time_ms: int


class ErrorResponse(BaseModel):
    """Why a request was refused, in one line."""

    error: str
