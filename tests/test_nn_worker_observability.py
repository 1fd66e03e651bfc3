"""An NN-worker rank seen from outside: TensorBoard curves and its ``/metrics``, with a real PS,
embedding worker and Redis (pyrsia/services/nn_worker/rank_stats.py, pyrsia/services/nn_worker/tensorboard.py)."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
import uuid

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from persia.ctx import TrainCtx
from persia.data import DataLoader, IterableDataset, StreamingDataset
from persia.embedding.optim import SGD
from pyrsia.services.nn_worker.rank_stats import RankStats
from pyrsia.services.nn_worker.tensorboard import TensorBoardLog
from pyrsia.shared.constants import ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.registry import Registry, RegistrySettings
from pyrsia.shared.settings import Settings
from tests.nn_helpers import SmallModel, environ, job_services, make_batch
from tests.test_metrics_push import recording_gateway, wait_for

STEPS = 6


class ListDataset(IterableDataset):
    def __init__(self, batches):
        super().__init__(buffer_size=4)
        self.batches = batches

    def __iter__(self):
        yield from self.batches


@pytest.fixture
def job(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"obs-{uuid.uuid4().hex[:8]}"}
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None, PERSIA_TENSORBOARD_DIR=None):
        with job_services(env, tmp_path / "svc"):
            yield env


def _scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_curves_of_a_real_job(job, tmp_path):
    """Every step's loss (log_every_n_steps=1) equals the one the test computed; the rate
    curves are there up to the last step; an eval scalar lands at the step it was logged at."""
    model = SmallModel()
    batches = [make_batch([10 * k + 1, 10 * k + 2, 10 * k + 3], seed=k) for k in range(STEPS)]
    losses = []
    with TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
        tensorboard_dir=tmp_path / "tb",
        log_every_n_steps=1,
    ) as ctx:
        for batch in DataLoader(ListDataset(batches), embedding_staleness=2):
            output, labels = ctx.forward(batch)
            loss = torch.nn.functional.binary_cross_entropy(output, labels[0])
            ctx.backward(loss)
            losses.append(float(loss.detach()))
        ctx.log_scalar("eval/auc", torch.tensor(0.625))
    run = tmp_path / "tb" / job["PERSIA_JOB_ID"] / "rank_0"
    assert run.is_dir() and any(p.name.startswith("events.out.tfevents") for p in run.iterdir())
    scalars = _scalars(run)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, STEPS + 1))
    assert [v for _, v in scalars["train/loss"]] == pytest.approx(losses, rel=1e-6)
    rates = (
        "train/samples_per_second",
        "train/lookup_wait_ms",
        "train/dense_step_ms",
        "train/backward_ms",
        "train/skipped_embedding_updates",
    )
    for tag in rates:  # once a second at the last step, and at the end: the last at STEPS
        steps = [s for s, _ in scalars[tag]]
        assert steps and steps == sorted(set(steps)) and steps[-1] == STEPS, (tag, steps)
        assert all(v >= 0 for _, v in scalars[tag]), tag
    assert all(v > 0 for _, v in scalars["train/samples_per_second"])
    assert all(v > 0 for _, v in scalars["train/dense_step_ms"])
    staleness = scalars["train/embedding_staleness"]  # at each loss point
    assert [s for s, _ in staleness] == list(range(1, STEPS + 1))
    assert all(0 <= v <= 10 for _, v in staleness)
    assert all(v == 0 for _, v in scalars["train/skipped_embedding_updates"])
    assert "train/loss_scale" not in scalars  # no GradScaler on the CPU
    assert scalars["eval/auc"] == [(STEPS, 0.625)]


def test_tensorboard_loss_every_n_steps_from_the_environment(job, tmp_path):
    """PERSIA_TENSORBOARD_DIR alone turns the curves on; the loss is sampled every N steps."""
    model = SmallModel()
    batches = [make_batch([7 * k + 1, 7 * k + 2], seed=k) for k in range(STEPS)]
    losses = []
    with environ(PERSIA_TENSORBOARD_DIR=str(tmp_path / "env_tb")):
        with TrainCtx(
            SGD(lr=0.1),
            torch.optim.SGD(model.parameters(), lr=0.1),
            model=model,
            mixed_precision=False,
            log_every_n_steps=3,
        ) as ctx:
            for batch in DataLoader(ListDataset(batches)):
                output, labels = ctx.forward(batch)
                loss = torch.nn.functional.binary_cross_entropy(output, labels[0])
                ctx.backward(loss)
                losses.append(float(loss.detach()))
    scalars = _scalars(tmp_path / "env_tb" / job["PERSIA_JOB_ID"] / "rank_0")
    assert [s for s, _ in scalars["train/loss"]] == [3, 6]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([losses[2], losses[5]], rel=1e-6)


def test_the_last_rate_is_not_diluted_by_a_pause_after_training(tmp_path):
    """Samples/s is measured up to the last step: an evaluation (here a 1.5 s pause) between
    the last step and the context's exit does not lower the last point."""
    stats = RankStats(loss_every=1)
    log = TensorBoardLog(tmp_path / "run", stats, has_scaler=False)
    log.start()
    started = time.perf_counter()
    for step in range(1, 5):
        stats.step_done(step, 100, torch.tensor(0.5), 1.0, True)
        log.record_step()
    trained_s = time.perf_counter() - started
    time.sleep(1.5)
    log.close()
    assert log.failed is None
    rates = _scalars(tmp_path / "run")["train/samples_per_second"]
    assert rates[-1][0] == 4
    assert rates[-1][1] > 400 / (trained_s + 0.5), (rates, trained_s)  # paused: 400/1.5


def test_a_directory_that_cannot_be_made_stops_the_context_at_enter(job, tmp_path):
    """The error names the argument; nothing is left half-entered: a TrainCtx enters next."""
    (tmp_path / "a_file").write_text("")
    model = SmallModel()
    ctx = TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
        tensorboard_dir=tmp_path / "a_file" / "tb",
    )
    with pytest.raises(ConfigError, match="tensorboard_dir"):
        ctx.__enter__()
    with TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
        tensorboard_dir=tmp_path / "tb",
    ) as ctx:
        assert ctx._report.tensorboard is not None


def test_without_a_directory_no_curves_and_bad_arguments_refused(job, tmp_path):
    model = SmallModel()
    with pytest.raises(ValueError, match="log_every_n_steps"):
        TrainCtx(
            SGD(lr=0.1),
            torch.optim.SGD(model.parameters(), lr=0.1),
            model=model,
            log_every_n_steps=0,
        )
    ctx = TrainCtx(
        SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1), model=model, mixed_precision=False
    )
    with pytest.raises(ValueError, match="tag"):
        ctx.log_scalar("", 1.0)
    for bad in ("high", True, torch.ones(2), None):
        with pytest.raises(ValueError, match="value"):
            ctx.log_scalar("eval/auc", bad)
    with ctx:
        ctx.log_scalar("eval/auc", 0.5)  # no directory: nothing, no error
        assert ctx._report.tensorboard is None


GLOBAL_CONFIG = """\
common_config:
  metrics_config:
    enable_metrics: true
    job_name: {job}
    push_interval_seconds: 1
"""


def _parse(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_a_rank_serves_and_pushes_its_training_metrics(redis_server, tmp_path):
    """Scrape a real rank's /metrics mid-job (the ingress' address from the registry): steps,
    samples, phases, staleness, loss (log_every_n_steps=1: the last step's), and the same
    registry pushed to a push gateway under role nn_worker."""
    job = f"obsm_{uuid.uuid4().hex[:6]}"
    (tmp_path / "global.yml").write_text(GLOBAL_CONFIG.format(job=job))
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": job}
    batch_rows = 3
    batches = [make_batch([900 + 3 * k, 901 + 3 * k, 902 + 3 * k], seed=k) for k in range(STEPS)]
    errors: list[BaseException] = []
    feeder = threading.Thread(target=lambda: _run(_feed_rank0(batches), errors))
    with recording_gateway() as gateway:
        with (
            environ(
                **env,
                RANK="0",
                WORLD_SIZE="1",
                LOCAL_RANK="0",
                PERSIA_TENSORBOARD_DIR=None,
                PERSIA_METRICS_GATEWAY_ADDR=gateway.address,
                PERSIA_GLOBAL_CONFIG=str(tmp_path / "global.yml"),
            ),
            job_services(env, tmp_path / "svc"),
        ):
            from persia import env as persia_env

            persia_env.reload_env()
            losses, scraped = _train_and_scrape_at_the_last_step(feeder)
            feeder.join()
            persia_env.reload_env()
        path = f"/metrics/job/{job}/replica_index/0/role/{ROLE_NN_WORKER}"
        assert wait_for(lambda: gateway.pushes(path), 10)
        method, _, pushed = gateway.pushes(path)[-1]
    assert not errors, errors
    assert scraped["pyrsia_nn_worker_steps"] == STEPS
    assert scraped["pyrsia_nn_worker_samples_total"] == STEPS * batch_rows
    assert scraped["pyrsia_nn_worker_loss"] == pytest.approx(losses[-1], rel=1e-6)
    assert scraped["pyrsia_nn_worker_skipped_embedding_updates_total"] == 0
    assert scraped["pyrsia_nn_worker_loss_scale"] == 1
    assert 0 <= scraped["pyrsia_nn_worker_gradients_in_flight"] <= 10
    assert scraped["pyrsia_nn_worker_lookup_wait_seconds_total"] >= 0
    assert "pyrsia_nn_worker_samples_per_second" in scraped
    for phase in ("autograd", "gradient_send", "dense_step"):
        assert scraped[f'pyrsia_nn_worker_step_phase_seconds_total{{phase="{phase}"}}'] > 0, phase
    assert method == "PUT"
    assert _parse(pushed)["pyrsia_nn_worker_steps"] == STEPS  # the final push: every step


async def _feed_rank0(batches) -> None:
    """Send each batch's ids to the embedding worker and its dense part to rank 0's ingress,
    then tell rank 0 the stream is done."""
    registry, client = Registry(RegistrySettings.from_env(Settings.from_env())), HttpClient()
    try:
        worker = (await registry.wait_for(ROLE_EMBEDDING_WORKER, timeout_s=30))[0]
        rank0 = (await registry.wait_for(ROLE_NN_WORKER, timeout_s=30))[0]
        for k, batch in enumerate(batches):
            await client.call(
                f"{worker.url}/batch",
                {"loader": 0, "batch_id": k, "batch": batch.id_part().to_wire()},
            )
            await client.call(
                f"{rank0.url}/ingress",
                {"loader": 0, "batch_id": k, "worker": 0, "dense": batch.dense_part().to_wire()},
                until=1e12,
            )
        await client.call(f"{rank0.url}/done", {"loader": 0, "loader_count": 1, "sent": STEPS})
    finally:
        await client.close()
        await registry.close()


async def _rank_url() -> str:
    registry = Registry(RegistrySettings.from_env(Settings.from_env()))
    try:
        return (await registry.wait_for(ROLE_NN_WORKER, timeout_s=30))[0].url
    finally:
        await registry.close()


def _train_and_scrape_at_the_last_step(feeder: threading.Thread):
    """Train rank 0 from the stream (``feeder`` started once the TrainCtx is entered) and
    scrape its /metrics right after step STEPS. Returns (every step's loss, the scrape;
    None if step STEPS never came)."""
    model = SmallModel()
    losses = []
    scraped = None
    with TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
        log_every_n_steps=1,
    ) as ctx:
        feeder.start()
        loader = DataLoader(StreamingDataset(buffer_size=2), timeout_ms=90000)
        for batch in loader:
            output, labels = ctx.forward(batch)
            loss = torch.nn.functional.binary_cross_entropy(output, labels[0])
            ctx.backward(loss)
            losses.append(float(loss.detach()))
            if len(losses) == STEPS:
                url = asyncio.run(_rank_url())
                with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
                    scraped = _parse(resp.read().decode())
    return losses, scraped


def _run(coro, errors: list[BaseException]) -> None:
    try:
        asyncio.run(coro)
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def test_the_loss_is_sampled_every_step_by_default():
    """A TensorBoard loss point per step unless asked otherwise (a curve needs every step)."""
    import inspect

    from persia.ctx import TrainCtx
    from pyrsia.services.nn_worker.rank_stats import RankStats

    assert inspect.signature(TrainCtx).parameters["log_every_n_steps"].default == 1
    stats = RankStats()
    sampled = [stats.step_done(k, 4, torch.tensor(float(k)), 1.0, True) for k in (1, 2, 3)]
    assert sampled == [True, True, True] and stats.sample[0] == 3
