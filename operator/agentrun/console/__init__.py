"""The web console (`agentrun console`, issue #33): runs, live transcripts and approvals in a browser.

It holds no rights of its own over runs: every read and write goes to the API server as the person
looking (identities.py), so Kubernetes RBAC decides what each one sees and may do. Modules: who asks
(identities.py), the API server as that person (api_calling.py), browser sessions and CSRF
(sessions.py), HTML (views.py, transcript_views.py), the HTTP routes (serving.py).
"""
