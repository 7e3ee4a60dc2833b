-- keel-workflows (issue 21): what the webhook events of an operation reported so far
-- (state, wait, submitted/confirmed links, indexed), so that each transition emits only
-- what changed. Written by the transition hook and the verdict sink, in the
-- transaction of the change (keel-workflows' events module).
ALTER TABLE operation ADD COLUMN webhook_mark jsonb;
