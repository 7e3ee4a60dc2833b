-- Issue 34 §1: an operation kind is listed once, in Rust (keel_workflows::OperationKind),
-- and decoded at the row: a stored kind the build does not know fails to decode, and
-- only that enum writes the column. The CHECK of 0027 repeated the list, so every new kind
-- needed a migration beside its workflow; it is dropped. Existing rows are unchanged.
ALTER TABLE operation DROP CONSTRAINT IF EXISTS operation_kind_check;
