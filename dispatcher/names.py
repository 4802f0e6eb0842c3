"""The names the dispatcher shares with the backend, the driver and the cluster.

Pure constants, one copy. The driver reads the environment variables below;
the sandbox pods the driver creates carry `JOB_ID_LABEL` and
`MANAGED_BY_LABEL=DRIVER_MANAGED_BY`, which is what reaping selects on (both
labels: the driver's own pod carries the same job id but is managed by us).
"""

COMPONENT = "dispatcher"

# Labels and annotations on everything the dispatcher creates.
JOB_ID_LABEL = "test-cabinet/job-id"
JOB_ID_ANNOTATION = "test-cabinet/job-id"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
DISPATCHER_MANAGED_BY = "test-cabinet-dispatcher"
DRIVER_MANAGED_BY = "test-cabinet-driver"
# The label the Job controller puts on a Job's pods (Kubernetes >= 1.27).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"

# The per-job token's key inside the Job's Secret.
TOKEN_KEY = "token"
DRIVER_CONTAINER = "driver"

# The driver's environment.
ENV_BACKEND_URL = "TCAB_BACKEND_URL"
ENV_JOB_ID = "TCAB_JOB_ID"
ENV_JOB_TOKEN = "TCAB_JOB_TOKEN"
ENV_LAUNCH_REQUEST = "TCAB_LAUNCH_REQUEST"
ENV_DRIVER_RUNTIME = "TCAB_DRIVER_RUNTIME"
ENV_POD_IP = "TCAB_DRIVER_POD_IP"
DRIVER_RUNTIME = "kubernetes"
# Passed through from the dispatcher's environment to the driver's, verbatim.
PASSTHROUGH_PREFIXES = ("TCAB_K8S_", "TCAB_CONTAINER_")
ENV_SANDBOX_NAMESPACE = "TCAB_K8S_NAMESPACE"

# Backend endpoints (docs/dispatcher.md, "The reference backend").
CLAIM_PATH = "/jobs/next"
STATUS_PATH = "/jobs/{id}/status"
