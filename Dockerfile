# agent-fleet image: the `fleet` CLI with every dependency; one image for all services.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FLEET_STATE_DIR=/var/lib/fleet

WORKDIR /app

# Only what the distribution needs (keeps local virtualenvs and state out of the image).
COPY pyproject.toml ./
COPY orchestrator ./orchestrator
COPY workers ./workers
COPY api ./api
COPY localfleet ./localfleet

RUN pip install . \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin fleet \
    && mkdir -p /var/lib/fleet \
    && chown fleet:fleet /var/lib/fleet

USER fleet

# The API and Flower (docker-compose.yml picks the command of each service).
EXPOSE 8765 5555

CMD ["fleet", "--help"]
