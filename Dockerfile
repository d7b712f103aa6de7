FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY contracts ./contracts
COPY services ./services
COPY projections ./projections
RUN pip install --no-cache-dir .
# The service runs unprivileged; the data dir (master key, index) is its user's alone. A fresh
# named volume mounted on /data takes this owner and mode from the image.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/engram engram \
    && mkdir -p /data && chown engram:engram /data && chmod 0700 /data
ENV HF_HUB_OFFLINE=1 ENGRAM_DATA_DIR=/data ENGRAM_MODEL_CACHE=/opt/engram/models
# The model's ONNX exports are made here, at install, so that no container start waits for one
# (and the unprivileged user need not write the cache): the default, and int8 for ENGRAM_ENCODER.
RUN engram model && engram model --encoder onnx-int8
USER 10001:10001
CMD ["engram", "serve"]
