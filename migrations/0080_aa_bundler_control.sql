-- Issue 33 §5: the bundler's debug controls per chain (the `debug_bundler_*` JSON-RPC
-- namespace, off unless `aa.debugNamespace` is set): manual bundling mode and a pending
-- "send a bundle now" request. No row: automatic bundling.
CREATE TABLE aa_bundler_control (
    chain_id        BIGINT      PRIMARY KEY CHECK (chain_id > 0),
    -- true: the bundler only bundles when asked (debug_bundler_sendBundleNow).
    manual          BOOLEAN     NOT NULL DEFAULT false,
    -- Raised by debug_bundler_sendBundleNow, cleared by the bundler's next pass (in the
    -- transaction that enqueues the bundle, or alone when nothing is ready).
    send_now        BOOLEAN     NOT NULL DEFAULT false,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
