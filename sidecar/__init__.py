"""The sidecar verifier (docs/adapter.md, docs/sidecar.md): a native sidecar in every trainer
pod that checks its own pod against the TrainJob's floor and recorded JobSet
UID, and reports a violation as a Warning Event on the TrainJob.

It runs in every pod, so it is built to be cheap: standard library only (no
kubernetes client, no YAML), at most 2 reads per check, plus one Event POST
per violation reported, and it never stops or changes the workload. Reporting
is all it does; the controller, which holds update rights, turns the Event
into the foreign flag.

Layers, lowest first (a module imports only from layers below it):
  settings, podinfo, check          pure: environment, Downward API files, the verdict
  api                               the one module that speaks HTTP to the apiserver
  report                            the Event and the JSON log lines
  main                              the loop: signals, interval, backoff
"""
