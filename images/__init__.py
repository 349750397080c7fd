"""Building the container images (images/Dockerfile) with Docker or podman."""
