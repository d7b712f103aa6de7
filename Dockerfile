FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY contracts ./contracts
COPY services ./services
COPY projections ./projections
RUN pip install --no-cache-dir .
ENV HF_HUB_OFFLINE=1
CMD ["engram", "serve"]
