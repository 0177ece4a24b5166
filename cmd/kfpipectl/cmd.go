package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// app holds the global flags and the streams of one run.
type app struct {
	out, errOut io.Writer
	getenv      func(string) string

	server    string
	tokenFile string
	output    string
	timeout   time.Duration
}

// run executes the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	a := &app{out: stdout, errOut: stderr, getenv: getenv}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "kfpipectl: %v\n", err)
	var ee *exitErr
	if errors.As(err, &ee) {
		return ee.code
	}
	// cobra's own errors: unknown command or flag, wrong arguments.
	return exitUsage
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "kfpipectl",
		Short: "Operate kfpipe through the dlq-consumer's admin API",
		Long: `kfpipectl operates kfpipe through the dlq-consumer's admin API.

The server comes from --server or KFPIPE_ADMIN_URL (default http://localhost:8090),
the bearer token from --token-file or KFPIPE_TOKEN. Every write needs --why (the
note the audit stream records; --failure-reason is the DLQ filter) and accepts --dry-run.

Exit codes: 0 done, 1 error (server unreachable or failing), 2 usage (bad command
line or input the API rejected), 3 not found, 4 refused (401, 403: the token may
not; 409: the target's state forbids the write), 5 nothing to do (a batch retry or
purge that selects no letter it may act on).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if a.output != "table" && a.output != "json" {
				return usagef("--output must be table or json, got %q", a.output)
			}
			a.warnDeprecated(cmd)
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usagef("%v", err) })
	pf := root.PersistentFlags()
	pf.StringVar(&a.server, "server", "", "admin API base URL (env KFPIPE_ADMIN_URL; default http://localhost:8090)")
	pf.StringVar(&a.tokenFile, "token-file", "", "file holding the bearer token (default: env KFPIPE_TOKEN)")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	pf.DurationVar(&a.timeout, "timeout", 30*time.Second, "timeout of each API call")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
	root.AddCommand(a.dlqCmd(), a.rateLimitCmd(), a.healthCmd(), a.auditCmd(), a.fleetCmd())
	root.AddCommand(a.customerCmd(), a.accountsCmd(), a.statsCmd())
	return root
}

// client builds the API client from the flags and environment.
func (a *app) client() (*client, error) {
	server := a.server
	if server == "" {
		server = a.getenv("KFPIPE_ADMIN_URL")
	}
	if server == "" {
		server = "http://localhost:8090"
	}
	var token string
	if a.tokenFile != "" {
		b, err := os.ReadFile(a.tokenFile)
		if err != nil {
			return nil, usagef("--token-file: %v", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return nil, usagef("--token-file %s is empty", a.tokenFile)
		}
	} else {
		token = strings.TrimSpace(a.getenv("KFPIPE_TOKEN"))
	}
	if token == "" {
		return nil, usagef("no token: set KFPIPE_TOKEN or pass --token-file")
	}
	return newClient(server, token, a.timeout)
}

// json reports whether --output json was asked for.
func (a *app) json() bool { return a.output == "json" }

// printJSON writes an API answer indented.
func (a *app) printJSON(data []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, bytes.TrimSpace(data), "", "  "); err != nil {
		return failf("the server's answer is not JSON: %v", err)
	}
	buf.WriteByte('\n')
	_, err := a.out.Write(buf.Bytes())
	return err
}

// printValue writes v as indented JSON.
func (a *app) printValue(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return failf("encoding: %v", err)
	}
	return a.printJSON(b)
}

func decode(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return failf("the server's answer does not parse: %v", err)
	}
	return nil
}

// args checks the number of positional arguments, as a usage error.
func args(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) != n {
			return usagef("%s takes %s (got %d arguments)", cmd.CommandPath(), names, len(a))
		}
		return nil
	}
}

// writeFlags adds --why and --dry-run to a write command. --why is the
// operator's note the audit stream records; it was --reason, which read
// too much like --failure-reason (the DLQ filter by a letter's failure):
// --reason still works, hidden, and warns on stderr.
func writeFlags(cmd *cobra.Command, reason *string, dry *bool) {
	cmd.Flags().StringVar(reason, "why", "", "why you do this (required, recorded in the audit stream)")
	cmd.Flags().StringVar(reason, "reason", "", "deprecated: --why")
	_ = cmd.Flags().MarkHidden("reason") // the warning: warnDeprecated
	cmd.Flags().BoolVar(dry, "dry-run", false, "act on nothing; say what would be done")
	cmd.MarkFlagsMutuallyExclusive("why", "reason")
}

// warnDeprecated tells on stderr (stdout stays the command's answer) that
// a deprecated flag was used.
func (a *app) warnDeprecated(cmd *cobra.Command) {
	if f := cmd.Flags().Lookup("reason"); f != nil && f.Hidden && f.Changed {
		fmt.Fprintln(a.errOut, "kfpipectl: --reason is deprecated: use --why (the note the audit stream records; --failure-reason filters dead letters by their failure)")
	}
}

func needReason(reason string) error {
	if strings.TrimSpace(reason) == "" {
		return usagef("--why is required on every write: say why (it is recorded in the audit stream)")
	}
	return nil
}

func fmtTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// read GETs path with q and decodes the answer into v; with --output json
// it prints the answer instead and says so (printed).
func (a *app) read(cmd *cobra.Command, path string, q url.Values, v any) (printed bool, err error) {
	c, err := a.client()
	if err != nil {
		return false, err
	}
	data, err := c.do(cmd.Context(), "GET", path, q, nil)
	if err != nil {
		return false, err
	}
	if a.json() {
		return true, a.printJSON(data)
	}
	return false, decode(data, v)
}
