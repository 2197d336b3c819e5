from __future__ import annotations

import uuid

from fastapi import APIRouter

from p2p.ingest.deps import ReadPrincipal, SessionDep
from p2p.shared.db.models import MiningJob
from p2p.shared.errors import NotFound
from p2p.shared.schemas import JobPublic

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> MiningJob:
    job = session.get(MiningJob, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job
