# The application image: API, worker and fake provider share it (different commands).
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md ./
COPY common ./common
COPY workflows ./workflows
COPY activities ./activities
COPY api ./api
COPY readmodel ./readmodel
COPY devstack ./devstack
COPY config ./config
COPY worker.py ./
RUN pip install --no-cache-dir .
USER nobody
EXPOSE 8000 8025
CMD ["uvicorn", "api.main:create_app", "--factory", "--host", "0.0.0.0", "--port", "8000"]
