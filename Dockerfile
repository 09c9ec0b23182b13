# Steward in a container. With compose.yaml: `docker compose up -d` (SQLite in a volume),
# or `docker compose --profile postgres up -d` with PostgreSQL beside it. Alone:
#   docker build -t steward .
#   docker run -d --restart unless-stopped -v steward-home:/data -v "$PWD/config:/etc/steward" \
#       --env-file .env steward
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    STEWARD_HOME=/data \
    XDG_CONFIG_HOME=/etc

# The source stays in /app: an editable install reads docs/slack-manifest.yaml from it.
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY bot ./bot
COPY connectors ./connectors
COPY store ./store
COPY docs ./docs
RUN pip install --no-cache-dir -c constraints.txt -e . \
    && useradd --uid 1000 --create-home --shell /usr/sbin/nologin steward \
    && install -d -o steward -g steward -m 0700 /data /etc/steward

# The home (database, Slack journal) is the volume; config.toml is /etc/steward/config.toml
# (`docker compose run --rm steward init` writes it); secrets come from the environment.
USER steward
VOLUME ["/data"]
WORKDIR /data
# Slack HTTP mode listens here (set [slack] http_host = "0.0.0.0" in the container).
EXPOSE 3000
# SIGTERM drains the work in hand, then exits 0; a killed container resumes where it
# stopped at the next start.
STOPSIGNAL SIGTERM
ENTRYPOINT ["steward"]
CMD ["run"]
