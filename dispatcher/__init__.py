"""The dispatcher: claims runs from the backend and creates one driver Job per run.

Stateless (the backend's job table and the cluster are the truth), configured
by environment variables only, no socket bound. The flow is drawn in `app`.
"""
