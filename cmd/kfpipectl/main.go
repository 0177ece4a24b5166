// Command kfpipectl is the on-call engineer's command line for the
// dlq-consumer's admin API: dead letters, rate limits, the health overview
// and the audit trail. It is a thin client: every command is one or a few
// admin API calls (docs/openapi.yaml), so what it may do is what the
// token's role allows.
//
// Configuration: the server from --server or KFPIPE_ADMIN_URL (default
// http://localhost:8090); the bearer token from --token-file or
// KFPIPE_TOKEN. Output is a table for people or, with --output json, the
// API's JSON for scripts.
//
// Exit codes (stable, for scripts):
//
//	0  done
//	1  error: the server unreachable or failing (5xx), a bad answer
//	2  usage: a bad command line, or input the API rejected (400, 413, 422)
//	3  not found (404)
//	4  refused: the token is missing a role or is unknown (401, 403), or the
//	   target's state forbids the write (409)
//	5  nothing to do: a batch retry or purge (or its dry run) selected no
//	   letter it may act on
//
// Every write takes --why (the note the audit stream records; the
// deprecated --reason still works) and --dry-run, which acts on nothing
// and says what the write would do. See docs/kfpipectl.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kfpipe/kfpipe/internal/version"
)

func main() {
	if version.Handle(os.Stdout, "kfpipectl", os.Args[1:], nil) {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
