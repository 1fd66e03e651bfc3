"""``persia-k8s-utils``: Kubernetes manifests for a PERSIA job, without an operator.

PERSIA's ``persia-k8s-utils gencrd`` wrote the PersiaJob custom resource definition for
its operator. Pyrsia needs no operator: it reads the PersiaJob YAML a PERSIA user already
has (``k8s/example/*.yml`` shape) and writes the plain objects (StatefulSets, Jobs,
Deployments, Services, Redis included) that ``kubectl apply -f`` runs::

    persia-k8s-utils gencrd adult-income.train.yml | kubectl apply -f -
    persia-k8s-utils gencrd --job adult-income.train.yml --output manifests.yml

``manifests`` is the same command under its own name. Other documents in the file
(PERSIA's NatsCluster) are skipped with a note: Pyrsia's registry is the generated Redis.
A bad file is one line on stderr naming the key, and exit code 2.

PERSIA's ``operator`` (a controller watching PersiaJob objects) and ``server`` (an HTTP
front for apply/delete/list) need a controller Pyrsia does not ship: both exit 2 and print
the kubectl commands that do the same with the generated manifests (:data:`INSTEAD`).
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

import yaml

from persia._k8s.manifests import DEFAULT_IMAGE, JOB_LABEL, build_manifests
from persia._k8s.spec import PersiaJobSpec, RoleSpec, parse_persia_job
from pyrsia.shared.cli import fail
from pyrsia.shared.errors import ConfigError

__all__ = ["generate", "main"]

_APPLY = "persia-k8s-utils gencrd job.yml | kubectl apply -f -"
_LABEL = f"{JOB_LABEL}=<job name>"
INSTEAD = {
    "gencrd": (
        "no CustomResourceDefinition to write: Pyrsia needs no operator or CRD. Pass the PersiaJob "
        f"YAML and apply the objects it becomes: {_APPLY}"
    ),
    "operator": (
        "Pyrsia needs no operator: nothing has to watch PersiaJob objects. Instead:\n"
        f"  start:   {_APPLY}\n"
        f"  watch:   kubectl get pods -l {_LABEL} -n <namespace>\n"
        f"  end:     kubectl delete all,secret -l {_LABEL} -n <namespace>\n"
        "(the manifests are plain StatefulSets, Indexed Jobs, Deployments and Services; see "
        "docs/guides/scaling.md, Kubernetes)"
    ),
    "server": (
        "Pyrsia needs no operator, and so no job server in front of one. Each of its routes is "
        "one kubectl command:\n"
        f"  /apply      {_APPLY}\n"
        f"  /delete     kubectl delete all,secret -l {_LABEL} -n <namespace>\n"
        f"  /listpods   kubectl get pods -l {_LABEL} -n <namespace>\n"
        "  /podstatus  kubectl get pod <pod name> -n <namespace> -o yaml\n"
        f"  /listjobs   kubectl get statefulsets,jobs -l {JOB_LABEL} -n <namespace> "
        f"-L {JOB_LABEL}\n"
        "(see docs/guides/scaling.md, Kubernetes)"
    ),
}
"""What to run instead of PERSIA's commands that need its operator."""


def _with_image(job: PersiaJobSpec, image: str) -> PersiaJobSpec:
    roles = {
        key: role if role.image else RoleSpec(**{**role.__dict__, "image": image})
        for key, role in job.roles.items()
    }
    return PersiaJobSpec(**{**job.__dict__, "roles": roles})


def generate(
    text: str, *, source: str = "job.yml", image: str | None = None, auth_secret: str | None = None
) -> tuple[str, list[str]]:
    """The manifests (one YAML stream) for every PersiaJob in ``text``, and notes for the user.

    Without ``auth_secret`` each job gets a Secret ``<job>-auth`` with a new random token.
    """
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    objects, notes = [], []
    for document in documents:
        kind = document.get("kind") if isinstance(document, dict) else None
        if kind != "PersiaJob":
            notes.append(
                f"{source}: skipped a {kind or 'non-PersiaJob'} document "
                "(Pyrsia's registry is the generated Redis; no NATS or operator needed)"
            )
            continue
        job = parse_persia_job(document, source=source)
        if image:
            job = _with_image(job, image)
        for name in job.dropped_env:
            notes.append(
                f"{source}: dropped env {name}: Pyrsia uses PERSIA_REDIS_URL "
                f"(set to redis://{job.name}-redis:6379/0)"
            )
        if auth_secret:
            objects += build_manifests(job, auth_secret=auth_secret)
        else:
            objects += build_manifests(job, auth_token=secrets.token_urlsafe(32))
    if not objects:
        raise ConfigError(f"{source}: no PersiaJob document (kind: PersiaJob) in the file")
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False), notes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="persia-k8s-utils",
        description="Write plain Kubernetes manifests (Redis, embedding PS and worker "
        "StatefulSets, NN-worker and data-loader Indexed Jobs, Services) for a PersiaJob YAML.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("gencrd", "manifests"):
        sub = commands.add_parser(name, help="PersiaJob YAML -> Kubernetes manifests")
        sub.add_argument(
            "job_file",
            nargs="?",
            metavar="JOB",
            help="the PersiaJob YAML (PERSIA's k8s example shape; or --job)",
        )
        sub.add_argument("--job", default=None, help="the PersiaJob YAML (same as JOB)")
        sub.add_argument(
            "--output", default="-", help="where to write the manifests (default stdout)"
        )
        sub.add_argument(
            "--auth-secret",
            default=None,
            help="an existing Secret (key 'token') holding PERSIA_AUTH_TOKEN; by "
            "default a Secret <job>-auth with a random token is written",
        )
        sub.add_argument(
            "--image",
            default=None,
            help=f"image for roles that name none (default {DEFAULT_IMAGE})",
        )
    for name, help_ in (
        ("operator", "PERSIA's operator: not needed; prints what to run instead"),
        ("server", "PERSIA's job server: not needed; prints the kubectl commands"),
    ):
        commands.add_parser(name, help=help_, add_help=False)  # PERSIA's flags are ignored
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command in ("operator", "server"):
        print(f"persia-k8s-utils {args.command}: {INSTEAD[args.command]}", file=sys.stderr)
        return 2
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.job and args.job_file and args.job != args.job_file:
        return fail(f"two job files given ({args.job_file} and --job {args.job}); pass one")
    if not (args.job or args.job_file):
        return fail(f"persia-k8s-utils {args.command}: {INSTEAD['gencrd']}")
    path = Path(args.job or args.job_file)
    if not path.is_file():
        return fail(f"{path}: no such file (set by --job)")
    try:
        text, notes = generate(
            path.read_text(), source=path.name, image=args.image, auth_secret=args.auth_secret
        )
    except ConfigError as exc:
        return fail(str(exc))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
