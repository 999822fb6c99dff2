"""Stand-ins for what cannot run here: a scripted Messages API and a Kubernetes API emulator."""
