"""The names of the contract (DESIGN.md §2, §4, §7): one copy, imported by
the toolkit, the controller and the sidecar. Pure constants, no imports, so
the sidecar can use it without paying for anything else."""

DOMAIN = "dispatch.phpboyscout.uk"

# Pod-template annotation carrying A, set through our runtime patch.
ADMISSION_ANNOTATION = f"{DOMAIN}/admission"
# TrainJob annotations.
FLOOR_ANNOTATION = f"{DOMAIN}/admission-floor"
JOBSET_UID_ANNOTATION = f"{DOMAIN}/jobset-uid"
FOREIGN_ANNOTATION = f"{DOMAIN}/foreign"
# Our entry in spec.runtimePatches (a list keyed by manager).
PATCH_MANAGER = f"{DOMAIN}/adapter"

# JobSet's pod label carrying J (= JobSet status.restarts).
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# The replicated job of the trainer (Trainer's name for it).
TRAINER_REPLICATED_JOB = "node"

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
