"""dispatch toolkit: execution identity for Kubeflow TrainJobs.

Layers, lowest first (a module imports only from layers below it):
  names, paths, backoff, jsonlog, envparse                        the core the controller, dispatcher and
                                                                  sidecar share: standard library only
  identity, detect, request, wrap, render, runtime_check          pure logic
  kube                                                            the one module that owns the kubernetes client
  adapter                                                         the operations
  cli                                                             click shell: parse, call, print

The long-running processes are packages beside this one, built on it:
controller/, dispatcher/ and sidecar/ (`toolkit controller` starts the
controller).
"""
