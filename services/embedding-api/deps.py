from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from p2p.embedding_api.search_plan import CostSlot
from p2p.embedding_api.text_cache import TextCache
from p2p.shared.deps import AdminPrincipal, ReadPrincipal, RuntimeDep, SessionDep, SettingsDep
from p2p.shared.errors import ServiceUnavailable

if TYPE_CHECKING:
    from p2p.embedding_api.batching import MicroBatcher
    from p2p.models.modeling import EmbeddingModel


@dataclass(frozen=True)
class ModelState:
    """The model that serves this process, swapped as a whole when the space switches versions.

    ``version_id`` is None while the space has no active version: the default model then serves
    embeds, and search has no vectors to answer from."""

    model: EmbeddingModel
    batcher: MicroBatcher
    space: str
    version_id: uuid.UUID | None
    name: str
    version: str | None
    dim: int
    load_error: str | None = None
    # What each search path costs on this version's table, filled in by a calibration after load.
    search_costs: CostSlot = field(default_factory=CostSlot)
    # Embeddings of recent text queries of this model (a new state starts empty).
    text_cache: TextCache = field(default_factory=TextCache)

    @property
    def cache_key(self) -> str:
        return self.version_id.hex if self.version_id is not None else f"default:{self.name}"

    def require_space(self) -> uuid.UUID:
        if self.version_id is None:
            reason = f" (loading the active version failed: {self.load_error})" if self.load_error else ""
            raise ServiceUnavailable(
                f"no embedding space is ready: space '{self.space}' has no active model version{reason}; "
                "register a model and activate it (POST /v1/models, then /v1/models/{id}/activate)",
                error_type="space_not_ready",
            )
        return self.version_id


async def get_model_state(request: Request) -> ModelState:
    state: ModelState | None = getattr(request.app.state, "model_state", None)
    if state is None:
        raise ServiceUnavailable("the embedding model is not loaded yet", error_type="model_not_loaded")
    return state


ModelStateDep = Annotated[ModelState, Depends(get_model_state)]


__all__ = [
    "AdminPrincipal",
    "ModelState",
    "ModelStateDep",
    "ReadPrincipal",
    "RuntimeDep",
    "SessionDep",
    "SettingsDep",
    "get_model_state",
]
