import { Hono } from "hono";

// Ponder requires an API file; the benchmark reads the database directly.
const app = new Hono();
export default app;
