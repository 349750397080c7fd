"""Kubernetes RBAC as the API server enforces it, over Kubeflow's own user roles of each release, and the people who
install the pipeline: for the stand-in API servers (tests/fake_kubernetes_api.py, tests/fake_coordination_api.py).

- The roles: kubeflow-admin, -edit, -view and every ClusterRole labelled to aggregate into them, as each release's
  kubeflow/manifests installs them (tests/vendor/kubeflow-user-roles-<release>.yaml), aggregated to a fixed point as
  the aggregation controller does, ClusterRoles applied later (manifests/admin/) included.
- The profile's bindings, as Kubeflow's profile controller makes them: the owner to kubeflow-admin
  (`namespaceAdmin`), the `default-editor` service account (which runs KFP steps) to kubeflow-edit, `default-viewer`
  to kubeflow-view; every authenticated user may create SelfSubjectAccessReviews (system:basic-user) and, where
  Trainer is installed, read ClusterTrainingRuntimes.
- Privilege-escalation prevention (kubernetes/website `rbac.md`; the API server's `ConfirmNoEscalation`): a Role is
  created only if its creator already holds every permission in it, or holds `escalate` on roles; a RoleBinding only
  if its creator holds every permission of the role it binds (a missing role: 404), or holds `bind` on it.
  ClusterRoles and ClusterRoleBindings: the cluster admin's.
- `apply(user, folder, namespace)` renders a kustomization (its `resources`, files and folders, and its `labels`) and
  creates each object as `user` would with `kubectl apply -k`, refused as the API server refuses it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

VENDOR = Path(__file__).parent / "vendor"
REPOSITORY = Path(__file__).resolve().parents[1]
NAMESPACE = "team-a"
ADMIN = "kubernetes-admin"  # system:masters: the cluster admin
OWNER = "alice@example.com"  # the profile's owner
EDITOR = f"system:serviceaccount:{NAMESPACE}:default-editor"
WORKERS = f"system:serviceaccount:{NAMESPACE}:cifar10-pipeline"
RBAC_GROUP = "rbac.authorization.k8s.io"

# The user roles each release installs (Kubeflow platform releases), and for the Trainer-only stand-ins (a
# standalone KFP with Trainer, or with neither job operator) the 1.11 roles, whose Trainer rules are v2.3.0's.
RELEASE_ROLES = {
    "1.9": "kubeflow-user-roles-1.9.1.yaml",
    "1.10": "kubeflow-user-roles-1.10.2.yaml",
    "1.11": "kubeflow-user-roles-1.11.0.yaml",
    "26.03": "kubeflow-user-roles-26.03.yaml",
    "trainer-2.2": "kubeflow-user-roles-1.11.0.yaml",
    "trainer-2.3": "kubeflow-user-roles-1.11.0.yaml",
    "none": "kubeflow-user-roles-1.11.0.yaml",
}
TRAINER_RELEASES = {"1.11", "26.03", "trainer-2.2", "trainer-2.3"}

# kind -> (API group, resource, namespaced): what the project's manifests hold.
KINDS = {
    "ServiceAccount": ("", "serviceaccounts", True),
    "ConfigMap": ("", "configmaps", True),
    "Service": ("", "services", True),
    "Deployment": ("apps", "deployments", True),
    "Role": (RBAC_GROUP, "roles", True),
    "RoleBinding": (RBAC_GROUP, "rolebindings", True),
    "ClusterRole": (RBAC_GROUP, "clusterroles", False),
    "ClusterRoleBinding": (RBAC_GROUP, "clusterrolebindings", False),
    "ClusterTrainingRuntime": ("trainer.kubeflow.org", "clustertrainingruntimes", False),
    "InferenceService": ("serving.kserve.io", "inferenceservices", True),
}
EVERYONE_RULES = (
    {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
     "verbs": ["create"]},
)  # fmt: skip
TRAINER_EVERYONE_RULES = (
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["clustertrainingruntimes"],
        "verbs": ["get", "list", "watch"],
    },
)  # kubeflow-trainer-view-cluster-runtimes, bound to system:authenticated


class Forbidden(Exception):  # noqa: N818 (an HTTP answer)
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason = status, reason


def forbidden(user: str, verb: str, group: str, resource: str, namespace: str | None, name: str = "") -> Forbidden:
    qualified = f"{resource}.{group}" if group else resource
    target = f'{qualified} "{name}"' if name else qualified
    where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    return Forbidden(
        403, "Forbidden",
        f'{target} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group "{group}" {where}',
    )  # fmt: skip


def rule_allows(rule: dict, verb: str, group: str, resource: str, name: str = "") -> bool:
    """Whether `rule` allows the request (`*` in a rule allows anything; resourceNames restrict to those names)."""
    names = rule.get("resourceNames") or []
    return (
        (group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
        and (resource in rule.get("resources", []) or "*" in rule.get("resources", []))
        and (verb in rule.get("verbs", []) or "*" in rule.get("verbs", []))
        and (not names or name in names)
    )


def render(folder: Path) -> list[dict]:
    """The objects `kubectl apply -k folder` sends: its resources (files, and folders with a kustomization of their
    own), with its `labels` added to each (this stand-in plays these two fields only, and refuses any other)."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kustomization) - {"apiVersion", "kind", "labels", "resources"}
    if unknown:
        raise AssertionError(f"{folder}/kustomization.yaml: the stand-in does not render {sorted(unknown)}")
    documents: list[dict] = []
    for resource in kustomization["resources"]:
        path = folder / resource
        if path.is_dir():
            documents += render(path)
        else:
            documents += [document for document in yaml.safe_load_all(path.read_text()) if document]
    for labels in kustomization.get("labels", []):
        for document in documents:
            document.setdefault("metadata", {}).setdefault("labels", {}).update(labels["pairs"])
    return documents


@dataclass
class Rbac:
    """The cluster's roles and bindings now, for one Kubeflow release and one profile namespace."""

    release: str
    cluster_roles: dict[str, dict] = field(default_factory=dict)
    roles: dict[tuple[str, str], dict] = field(default_factory=dict)
    bindings: dict[tuple[str, str], dict] = field(default_factory=dict)  # (namespace, name) -> RoleBinding
    objects: dict[tuple[str, str | None, str], dict] = field(default_factory=dict)  # (kind, namespace, name)

    def __post_init__(self):
        for document in yaml.safe_load_all((VENDOR / RELEASE_ROLES[self.release]).read_text()):
            if document and document.get("kind") == "ClusterRole":
                self.cluster_roles[document["metadata"]["name"]] = document
        profile = {"namespaceAdmin": ("User", OWNER, "kubeflow-admin"),
                   "default-editor": ("ServiceAccount", "default-editor", "kubeflow-edit"),
                   "default-viewer": ("ServiceAccount", "default-viewer", "kubeflow-view")}  # fmt: skip
        for name, (kind, subject, role) in profile.items():
            self.bindings[(NAMESPACE, name)] = {
                "kind": "RoleBinding", "metadata": {"name": name, "namespace": NAMESPACE},
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": kind, "name": subject, "namespace": NAMESPACE}],
            }  # fmt: skip

    @classmethod
    def installed(cls, release: str) -> Rbac:
        """A cluster where the admin applied manifests/admin/ and the profile owner then applied manifests/, each as
        docs/cluster.md says (the TrainJob runtime, manifests/admin/trainer/, is the Kubernetes stand-in's to
        create: it validates it against the release's CRD)."""
        rbac = cls(release)
        rbac.apply(ADMIN, REPOSITORY / "manifests" / "admin", None)
        rbac.apply(OWNER, REPOSITORY / "manifests", NAMESPACE)
        return rbac

    # -- what a role holds --------------------------------------------------------------------------------------

    def cluster_role_rules(self, name: str) -> list[dict] | None:
        """A ClusterRole's rules after aggregation (None when there is no such role)."""
        if name not in self.cluster_roles:
            return None
        rules = {role: list(document.get("rules") or []) for role, document in self.cluster_roles.items()}
        changed = True
        while changed:
            changed = False
            for role, document in self.cluster_roles.items():
                for selector in (document.get("aggregationRule") or {}).get("clusterRoleSelectors", []):
                    wanted = selector.get("matchLabels", {})
                    for other, other_document in self.cluster_roles.items():
                        labels = other_document["metadata"].get("labels") or {}
                        if other == role or any(labels.get(key) != value for key, value in wanted.items()):
                            continue
                        for rule in rules[other]:
                            if rule not in rules[role]:
                                rules[role].append(rule)
                                changed = True
        return rules[name]

    def _reference_rules(self, reference: dict, namespace: str) -> list[dict] | None:
        if reference["kind"] == "ClusterRole":
            return self.cluster_role_rules(reference["name"])
        role = self.roles.get((namespace, reference["name"]))
        return None if role is None else list(role.get("rules") or [])

    def rules_for(self, user: str, namespace: str | None) -> list[dict]:
        """Every rule `user` holds in `namespace` (cluster-wide ones only, for None)."""
        rules = list(EVERYONE_RULES)
        if self.release in TRAINER_RELEASES:
            rules += TRAINER_EVERYONE_RULES
        if namespace is None:
            return rules
        for (binding_namespace, _name), binding in self.bindings.items():
            if binding_namespace == namespace and any(
                _subject(subject, binding_namespace) == user for subject in binding.get("subjects", [])
            ):
                rules += self._reference_rules(binding["roleRef"], namespace) or []
        return rules

    def allows(self, user: str, verb: str, group: str, resource: str, namespace: str | None, name: str = "") -> bool:
        if user == ADMIN:
            return True
        return any(rule_allows(rule, verb, group, resource, name) for rule in self.rules_for(user, namespace))

    def authorize(self, user: str, verb: str, group: str, resource: str, namespace: str | None, name: str = "") -> None:
        if not self.allows(user, verb, group, resource, namespace, name):
            raise forbidden(user, verb, group, resource, namespace, name)

    def not_held(self, user: str, rules: list[dict], namespace: str | None) -> list[dict]:
        """The parts of `rules` that `user` does not hold in `namespace` (each group, resource and verb apart)."""
        if user == ADMIN:
            return []
        missing = []
        for rule in rules:
            lacking = [
                verb
                for group in rule.get("apiGroups", [])
                for resource in rule.get("resources", [])
                for verb in rule.get("verbs", [])
                if not any(
                    _covers(held, verb, group, resource, rule.get("resourceNames") or [])
                    for held in self.rules_for(user, namespace)
                )
            ]
            if lacking:
                missing.append({**rule, "verbs": sorted(set(lacking), key=rule["verbs"].index)})
        return missing

    # -- what a user may create ---------------------------------------------------------------------------------

    def create(self, user: str, document: dict, namespace: str | None) -> dict:
        """Create one object as `user`, as the API server would (authorization, then escalation prevention)."""
        kind = document["kind"]
        if kind not in KINDS:
            raise AssertionError(f"the stand-in does not serve {kind}")
        group, resource, namespaced = KINDS[kind]
        name = document["metadata"]["name"]
        where = namespace if namespaced else None
        self.authorize(user, "create", group, resource, where)
        if kind in ("Role", "ClusterRole") and not self.allows(user, "escalate", group, resource, where, name):
            missing = self.not_held(user, list(document.get("rules") or []), where)
            if missing:
                raise _escalation(user, resource, name, missing)
        if kind in ("RoleBinding", "ClusterRoleBinding"):
            reference = document["roleRef"]
            bound = "clusterroles" if reference["kind"] == "ClusterRole" else "roles"
            if not self.allows(user, "bind", RBAC_GROUP, bound, where, reference["name"]):
                rules = self._reference_rules(reference, namespace or "")
                if rules is None:
                    raise Forbidden(404, "NotFound", f'{bound}.{RBAC_GROUP} "{reference["name"]}" not found')
                missing = self.not_held(user, rules, where)
                if missing:
                    raise _escalation(user, resource, name, missing)
        stored = copy.deepcopy(document)
        stored["metadata"]["namespace"] = where
        key = (kind, where, name)
        if key in self.objects:
            raise Forbidden(409, "AlreadyExists", f'{resource}.{group} "{name}" already exists')
        self.objects[key] = stored
        if kind == "ClusterRole":
            self.cluster_roles[name] = stored
        elif kind == "Role":
            self.roles[(where, name)] = stored
        elif kind == "RoleBinding":
            self.bindings[(where, name)] = stored
        return stored

    def apply(self, user: str, folder: Path, namespace: str | None) -> list[dict]:
        """`kubectl apply -k folder -n namespace` as `user`: every object created, or Forbidden at the first the API
        server refuses (kubectl goes on with the others and fails at the end; the first refusal is what it says)."""
        refusals = []
        created = []
        for document in render(folder):
            try:
                created.append(self.create(user, document, namespace))
            except Forbidden as refused:
                refusals.append(refused)
        if refusals:
            raise refusals[0]
        return created


def _subject(subject: dict, namespace: str) -> str:
    if subject["kind"] == "ServiceAccount":
        return f"system:serviceaccount:{subject.get('namespace', namespace)}:{subject['name']}"
    return subject["name"]


def _covers(held: dict, verb: str, group: str, resource: str, names: list[str]) -> bool:
    """Whether the held rule covers (group, resource, verb) for `names` (all names when empty)."""
    held_names = held.get("resourceNames") or []
    if held_names and (not names or not set(names) <= set(held_names)):
        return False
    return (
        (group in held.get("apiGroups", []) or "*" in held.get("apiGroups", []))
        and (resource in held.get("resources", []) or "*" in held.get("resources", []))
        and (verb in held.get("verbs", []) or "*" in held.get("verbs", []))
    )


def _escalation(user: str, resource: str, name: str, missing: list[dict]) -> Forbidden:
    """The API server's refusal of a role or binding that grants more than its creator holds."""
    held = "\n".join(
        f"{{APIGroups:{json.dumps(rule.get('apiGroups', []))}, Resources:{json.dumps(rule.get('resources', []))}, "
        f"Verbs:{json.dumps(rule['verbs'])}}}"
        for rule in missing
    )
    return Forbidden(
        403, "Forbidden",
        f'{resource}.{RBAC_GROUP} "{name}" is forbidden: user "{user}" (groups=["system:authenticated"]) is '
        f"attempting to grant RBAC permissions not currently held:\n{held}",
    )  # fmt: skip
