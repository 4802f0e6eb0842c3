"""The names of the contract (docs/prologue.md, docs/toolkit.md, docs/adapter.md): one copy, imported by
the toolkit, the controller and the sidecar. Pure constants, no imports, so
the sidecar can use it without paying for anything else."""

DOMAIN = "dispatch.phpboyscout.uk"

# Pod-template annotation carrying A, set through our runtime patch.
ADMISSION_ANNOTATION = f"{DOMAIN}/admission"
# TrainJob annotations.
FLOOR_ANNOTATION = f"{DOMAIN}/admission-floor"
JOBSET_UID_ANNOTATION = f"{DOMAIN}/jobset-uid"
FOREIGN_ANNOTATION = f"{DOMAIN}/foreign"
# The TrainJob's execution history (toolkit.history writes it; the sidecar reads its stop times).
HISTORY_ANNOTATION = f"{DOMAIN}/history"
# TrainJob label set to "true" with the foreign annotation and removed with it (toolkit.flagmark),
# so that a label selector finds every flagged TrainJob.
FOREIGN_LABEL = f"{DOMAIN}/foreign"
# Which Workload admission the last raise was for, and the TrainJob generation that raise left
# (controller.admission); any raise that is not for a Workload removes it.
RAISED_FOR_ANNOTATION = f"{DOMAIN}/raised-for"
# Our entry in spec.runtimePatches (a list keyed by manager).
PATCH_MANAGER = f"{DOMAIN}/adapter"
# The field manager of the raise's update, and of nothing else: the apiserver stamps its
# managedFields entry with the time of the last raise (toolkit.raising.last_raise).
RAISE_FIELD_MANAGER = f"{DOMAIN}/raise"
# The field manager of `toolkit adopt`'s update, and of nothing else: every adoption changes the
# count in ADOPTIONS_ANNOTATION, so the apiserver stamps this manager's managedFields entry with
# the time of the last adoption (toolkit.history.adopted_at), whatever the operator's clock says.
ADOPT_FIELD_MANAGER = f"{DOMAIN}/adopt"
ADOPTIONS_ANNOTATION = f"{DOMAIN}/adoptions"

# JobSet's pod label carrying J (= JobSet status.restarts).
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# The UID of the JobSet that created the pod (JobSet sets it on every pod).
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
# The replicated job of the trainer (Trainer's name for it), and its trainer container, the one
# Trainer gives the TrainJob's spec.trainer (command, args, env).
TRAINER_REPLICATED_JOB = "node"
TRAINER_CONTAINER = "node"

# Prologue inputs (environment of the trainer container).
ENV_ADMISSION = "DISPATCH_K8S_ADMISSION"
ENV_RESTART = "DISPATCH_K8S_RESTART"
ENV_EPOCH_PREFIX = "DISPATCH_K8S_EPOCH_PREFIX"
ENV_TOKEN_PREFIX = "DISPATCH_K8S_TOKEN_PREFIX"
ENV_WORKDIR = "DISPATCH_K8S_WORKDIR"
RESERVED_ENV_PREFIX = "DISPATCH_"

# Event reasons. The controller turns a sidecar's Warning Event with
# SIDECAR_VIOLATION_REASON into the foreign flag.
SIDECAR_VIOLATION_REASON = "DispatchIdentityViolation"
FOREIGN_REASON = "DispatchForeign"

# Kubeflow Trainer API.
TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"

# TrainJob annotations naming what a rendered TrainJob runs (toolkit.render).
JOB_ID_ANNOTATION = f"{DOMAIN}/job-id"
GENERATION_ANNOTATION = f"{DOMAIN}/generation"
SUBMISSION_ANNOTATION = f"{DOMAIN}/submission"
ATTEMPT_ANNOTATION = f"{DOMAIN}/attempt"
# A TrainJob made without a StartRequest (the Kubeflow SDK, kubectl) in a namespace carrying
# IDENTITY_NAMESPACE_LABEL = "enabled" is wrapped at creation by the admission policy
# `dispatch-identity` (deployments/k8s/base/controller/identity-policy.yaml), which marks it
# DERIVED_ANNOTATION, or marks it REFUSED_ANNOTATION with the reason it cannot be wrapped. Its
# prefixes reach the trainer through the Downward API, from the pod-template annotations below,
# which the admission check writes into our runtime-patch entry with the first raise
# (toolkit.derive); the generation comes from a counter per namespace that outlives the TrainJob,
# in the ConfigMap GENERATIONS_CONFIGMAP of the controller's namespace.
IDENTITY_NAMESPACE_LABEL = f"{DOMAIN}/identity"
IDENTITY_NAMESPACE_VALUE = "enabled"
DERIVED_ANNOTATION = f"{DOMAIN}/derived"
REFUSED_ANNOTATION = f"{DOMAIN}/refused"
EPOCH_PREFIX_ANNOTATION = f"{DOMAIN}/epoch-prefix"
TOKEN_PREFIX_ANNOTATION = f"{DOMAIN}/token-prefix"
GENERATIONS_CONFIGMAP = "dispatch-generations"
# Where the release installs the controller (its Lease and that counter live there).
CONTROLLER_NAMESPACE = "dispatch-system"
# Kueue's label naming the LocalQueue (kueue mode).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# The sidecar verifier (toolkit.render.sidecar_container): a native sidecar
# (an initContainer with restartPolicy Always) in the `node` pod template.
SIDECAR_CONTAINER = "dispatch-sidecar"
SIDECAR_SERVICE_ACCOUNT = "dispatch-sidecar"
# A Downward API volume mounted here holds one file per item: `annotations`
# and `labels` (the pod's, as key="value" lines), `name` and `namespace`.
PODINFO_VOLUME = "dispatch-podinfo"
PODINFO_DIR = "/etc/dispatch/podinfo"
# The sidecar marks its first check done in a file on a memory-backed emptyDir (its root
# filesystem is read-only); its startupProbe (`python3 -m sidecar --started`) looks for it, so
# the kubelet starts the trainer only once that first check has run, whatever its verdict.
SIDECAR_STATE_VOLUME = "dispatch-sidecar-state"
# The sidecar's own ServiceAccount token (a projected volume, the pod's automount off), mounted
# where the sidecar looks for its in-cluster credentials; no other container mounts it.
SIDECAR_TOKEN_VOLUME = "dispatch-sidecar-token"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SIDECAR_STATE_DIR = "/run/dispatch-sidecar"
SIDECAR_STARTED_FILE = SIDECAR_STATE_DIR + "/started"
SIDECAR_STARTED_ENV = "DISPATCH_SIDECAR_STARTED_FILE"
