"""The API's request and response bodies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from saga_tasks.core.states import SagaStatus


class StartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    business_key: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any]


class StartResponse(BaseModel):
    saga_id: str
    saga_type: str
    business_key: str
    correlation_id: str
    status: SagaStatus
    created: bool
    status_url: str


class ActionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000)
    expect_version: int = Field(ge=0)
    step: str | None = Field(default=None, max_length=200)
    status: Literal["COMPLETED", "COMPENSATED", "FAILED"] | None = None


class SignalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: dict[str, Any]
    reason: str = Field(min_length=1, max_length=1000)
    expect_version: int | None = Field(default=None, ge=0)


class MigrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000)
    to_version: int = Field(ge=1)
    expect_version: int | None = Field(default=None, ge=0)


class HeldActionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000)
    force: bool = False
    force_reason: str | None = Field(default=None, max_length=1000)
    expect_version: int | None = Field(default=None, ge=0)


Action = Literal["retry-step", "skip-step", "compensate", "resolve"]
