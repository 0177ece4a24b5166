package main

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// filterFlags are the DLQ selection flags shared by ls, export, retry and
// purge.
type filterFlags struct {
	user, failure string
	review        string // "", "true", "false"
	all           bool
	limit         int
}

// add registers the filter flags; batch adds --all, and --limit when
// limited (purge has none: the index purges every match).
func (f *filterFlags) add(cmd *cobra.Command, batch, limited bool) {
	cmd.Flags().StringVar(&f.user, "user", "", "only this user (external_userid)")
	cmd.Flags().StringVar(&f.failure, "failure-reason", "", "only this failure reason, e.g. rate_limited")
	cmd.Flags().StringVar(&f.review, "review", "", "true: only letters in manual review; false: only the others")
	_ = cmd.RegisterFlagCompletionFunc("review", cobra.FixedCompletions([]string{"true", "false"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("failure-reason", cobra.FixedCompletions(failureReasons(), cobra.ShellCompDirectiveNoFileComp))
	if batch {
		cmd.Flags().BoolVar(&f.all, "all", false, "select every dead letter (needed when no other filter is given)")
	}
	if batch && limited {
		cmd.Flags().IntVar(&f.limit, "limit", 0, "act on at most this many (0: no limit)")
	}
}

func (f *filterFlags) reviewValue() (*bool, error) {
	if f.review == "" {
		return nil, nil
	}
	b, err := strconv.ParseBool(f.review)
	if err != nil {
		return nil, usagef("--review must be true or false, got %q", f.review)
	}
	return &b, nil
}

func (f *filterFlags) query() (url.Values, error) {
	q := url.Values{}
	if f.user != "" {
		q.Set("user", f.user)
	}
	if f.failure != "" {
		q.Set("reason", f.failure)
	}
	r, err := f.reviewValue()
	if r != nil {
		q.Set("review", strconv.FormatBool(*r))
	}
	return q, err
}

// batchBody is the API's body for batch-retry and purge.
type batchBody struct {
	Filter         batchFilter `json:"filter"`
	Reason         string      `json:"reason"`
	DryRun         bool        `json:"dry_run,omitempty"`
	IncludeInvalid bool        `json:"include_invalid,omitempty"`
	Unblock        bool        `json:"unblock,omitempty"`
}

type batchFilter struct {
	User   string `json:"user,omitempty"`
	Reason string `json:"reason,omitempty"`
	Review *bool  `json:"review,omitempty"`
	Limit  int    `json:"limit,omitempty"`
	All    bool   `json:"all,omitempty"`
}

func (f *filterFlags) body(reason string, dry bool) (batchBody, error) {
	r, err := f.reviewValue()
	if err != nil {
		return batchBody{}, err
	}
	if f.user == "" && f.failure == "" && r == nil && !f.all {
		return batchBody{}, usagef("select the dead letters with --user, --failure-reason or --review, or pass --all")
	}
	return batchBody{Filter: batchFilter{User: f.user, Reason: f.failure, Review: r, Limit: f.limit, All: f.all},
		Reason: reason, DryRun: dry}, nil
}

func failureReasons() []string { return deadletter.Names() }

func (a *app) dlqCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "dlq", Short: "Dead letters: list, show, retry, purge, export"}
	cmd.AddCommand(a.dlqLs(), a.dlqShow(), a.dlqRetry(), a.dlqPurge(), a.dlqExport(), a.dlqBatches(), a.dlqBatch(), a.dlqCancel())
	return cmd
}

func (a *app) dlqLs() *cobra.Command {
	var f filterFlags
	var limit int
	var cursor string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters, newest first (one page; the next page's cursor goes to stderr)",
		Args:  args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := f.query()
			if err != nil {
				return err
			}
			var page struct {
				Messages   []console.DLQMessage `json:"messages"`
				NextCursor string               `json:"next_cursor"`
			}
			if printed, err := a.read(cmd, "/admin/dlq/messages", onePage(q, limit, cursor), &page); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tUSER\tREASON\tSTATE\tFAILED\tRETRIES\tNEXT RETRY\tPREVIEW")
			for _, m := range page.Messages {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, m.User, m.Reason, m.State, fmtTime(&m.FailureTime),
					m.RetryCount, fmtTime(m.NextRetryTime), oneLine(m.Preview))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if page.NextCursor != "" {
				fmt.Fprintf(a.errOut, "more: kfpipectl dlq ls --cursor %s\n", page.NextCursor)
			}
			return nil
		},
	}
	f.add(cmd, false, false)
	cmd.Flags().IntVar(&limit, "limit", 50, "page size (1-500)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "the next page's cursor from the previous ls")
	return cmd
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func (a *app) dlqShow() *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter with its original message",
		Args:  args(1, "one dead-letter ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			var m console.DLQMessage
			if printed, err := a.read(cmd, "/admin/dlq/messages/"+url.PathEscape(argv[0]), nil, &m); printed || err != nil {
				return err
			}
			return a.showMessage(m)
		},
	}
}

func (a *app) showMessage(m console.DLQMessage) error {
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	rows := [][2]string{
		{"id", m.ID}, {"user", m.User}, {"open_kfid", orDash(m.OpenKfID)}, {"reason", m.Reason},
		{"details", orDash(oneLine(m.Details))}, {"state", m.State}, {"failure_time", fmtTime(&m.FailureTime)},
		{"retry_count", strconv.Itoa(m.RetryCount)}, {"failures", failures(m)}, {"next_retry_time", fmtTime(m.NextRetryTime)},
		{"source", fmt.Sprintf("%s/%d@%d", m.SourceTopic, m.SourcePartition, m.SourceOffset)},
		{"dlq", fmt.Sprintf("partition %d offset %d", m.DLQPartition, m.DLQOffset)},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(m.Message) > 0 {
		fmt.Fprintln(a.out, "message:")
		return a.printJSON(m.Message)
	}
	return nil
}

// failures says how often the letter's message failed and since when (a
// message has one letter: its retries that failed again are its history).
func failures(m console.DLQMessage) string {
	n := max(m.Failures, 1)
	if n == 1 || m.FirstFailure == nil {
		return strconv.Itoa(n)
	}
	return fmt.Sprintf("%d since %s", n, fmtTime(m.FirstFailure))
}

func (a *app) dlqRetry() *cobra.Command {
	var f filterFlags
	var reason string
	var dry, wait, includeInvalid, unblock bool
	cmd := &cobra.Command{
		Use:   "retry [ID]",
		Short: "Retry one dead letter now, or every one a filter selects",
		Long: `Retry one dead letter now (by ID), or every retryable one that --user,
--failure-reason, --review or --all select (a batch retry, at most --limit).
A batch runs on the dlq-consumer at admin.batch_rate letters a second, each
user's letters in order, skipping those whose message is done already; this
command follows it to its end (--wait=false: print its ID and return; then
kfpipectl dlq batch ID, kfpipectl dlq cancel ID).
A message has one letter. A retry skips letters retried already (until their
message fails again), letters due now (they go anyway) and, unless
--include-invalid, letters whose reason is never retried (invalid_message:
the record was malformed; handler_rejected: the bot refused it for good);
one letter and a batch decide alike.
--unblock (with --user) unblocks the user in the rate limiter, then retries
the user's letters: one audited action.
With --dry-run nothing is retried: the server decides exactly as the real
call would and says what it would retry (for a batch: how many messages, of
which users, what it would skip and which users are blocked now).
Exit 5 when nothing selected is retried (a dry run too).`,
		Args: func(cmd *cobra.Command, argv []string) error {
			if len(argv) > 1 {
				return usagef("%s takes at most one dead-letter ID", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := needReason(reason); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if len(argv) == 1 {
				if f.user != "" || f.failure != "" || f.review != "" || f.all || f.limit != 0 {
					return usagef("give either a dead-letter ID or filter flags, not both")
				}
				if unblock {
					return usagef("--unblock takes --user, not a dead-letter ID")
				}
				return a.retryOne(cmd, c, argv[0], reason, dry, includeInvalid)
			}
			if unblock && f.user == "" {
				return usagef("--unblock needs --user: it unblocks that user, then retries the user's letters")
			}
			body, err := f.body(reason, dry)
			if err != nil {
				return err
			}
			body.IncludeInvalid, body.Unblock = includeInvalid, unblock
			return a.batch(cmd, c, "/admin/dlq/batch-retry", body, wait)
		},
	}
	f.add(cmd, true, true)
	writeFlags(cmd, &reason, &dry)
	cmd.Flags().BoolVar(&wait, "wait", true, "follow a batch until it ends")
	cmd.Flags().BoolVar(&includeInvalid, "include-invalid", false,
		"retry letters whose reason is never retried (invalid_message, handler_rejected) too, e.g. after fixing the bot that refused them (audited)")
	cmd.Flags().BoolVar(&unblock, "unblock", false, "with --user: unblock the user in the rate limiter, then retry the user's letters (one audited action)")
	return cmd
}

// retryOne retries one letter; a dry run asks the server the same
// question (dry_run), so it answers what the real call would: 200, or 409
// with why the letter is not retried (exit 4), or 404 (exit 3).
func (a *app) retryOne(cmd *cobra.Command, c *client, id, reason string, dry, includeInvalid bool) error {
	path := "/admin/dlq/retry/" + url.PathEscape(id)
	data, err := c.do(cmd.Context(), "POST", path, nil,
		map[string]any{"reason": reason, "dry_run": dry, "include_invalid": includeInvalid})
	if err != nil {
		return err
	}
	if a.json() {
		return a.printJSON(data)
	}
	if dry {
		fmt.Fprintf(a.out, "dry run: would retry %s\n", id)
		return nil
	}
	fmt.Fprintf(a.out, "retried %s\n", id)
	return nil
}

// batch sends a batch write. A dry run prints what the batch would do;
// otherwise, with wait, it follows the batch to its end (progress on
// stderr) and prints what it did, else it prints the batch's ID.
func (a *app) batch(cmd *cobra.Command, c *client, path string, body batchBody, wait bool) error {
	data, err := c.do(cmd.Context(), "POST", path, nil, body)
	if err != nil {
		return err
	}
	var p console.BatchPlan
	if err := decode(data, &p); err != nil {
		return err
	}
	verb := map[string]string{console.ActionRetry: "retry", console.ActionPurge: "purge"}[p.Action]
	if p.Unblocked != "" && !a.json() {
		fmt.Fprintf(a.out, "unblocked %s\n", p.Unblocked)
	}
	if body.DryRun || p.Batch == nil || !wait {
		if a.json() {
			if err := a.printJSON(data); err != nil {
				return err
			}
		} else {
			switch {
			case body.DryRun:
				fmt.Fprintf(a.out, "dry run: would %s %d dead letter(s): %d message(s) of %d user(s)", verb, p.Count, p.Messages, p.Users)
				if s := skipped(p); s != "" {
					fmt.Fprintf(a.out, "; would skip %s", s)
				}
				fmt.Fprintf(a.out, ", %.0f s at %d a second\n", p.Seconds, p.Rate)
				for _, u := range p.TopUsers {
					fmt.Fprintf(a.out, "  %s\t%d\n", u.User, u.Count)
				}
			case p.Batch == nil:
			default:
				fmt.Fprintf(a.out, "batch %s started: %s %d dead letter(s) at %d a second; follow it with: kfpipectl dlq batch %s\n",
					p.Batch.ID, verb, p.Batch.Total, p.Rate, p.Batch.ID)
			}
			warnBlocked(a.out, p.Blocked, body.Unblock && body.DryRun)
		}
		if p.Count == 0 {
			return nothingf("nothing to %s: the filter selects %d dead letter(s)%s", verb, p.Selected, orSkipped(p))
		}
		return nil
	}
	warnBlocked(a.out, p.Blocked, false)
	return a.follow(cmd, c, p.Batch.ID)
}

// skipped says what a retry's plan skips, "" for nothing.
func skipped(p console.BatchPlan) string {
	var parts []string
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(p.AlreadyDone, "done already")
	add(p.NotRetryable, "never retried (invalid_message or handler_rejected: add --include-invalid to retry them)")
	add(p.Settled, "retried already")
	add(p.Busy, "due now or being re-injected")
	return strings.Join(parts, ", ")
}

func orSkipped(p console.BatchPlan) string {
	if s := skipped(p); s != "" {
		return ", none a retry may act on: " + s
	}
	return ""
}

// warnBlocked warns of blocked users whose letters a retry would send.
func warnBlocked(w io.Writer, bs []console.BlockedUser, unblocking bool) {
	if len(bs) == 0 {
		return
	}
	if unblocking {
		fmt.Fprintf(w, "would unblock %s first\n", bs[0].User)
		return
	}
	fmt.Fprintf(w, "warning: %d of these users are blocked by the rate limiter; their letters would be refused again (user_blocked):\n", len(bs))
	for _, b := range bs {
		until := "permanently"
		if !b.Permanent {
			until = "until " + fmtTime(b.BlockedUntil)
		}
		fmt.Fprintf(w, "  %s\tblocked %s\n", b.User, until)
	}
	fmt.Fprintln(w, "  unblock and retry a user's letters in one step: kfpipectl dlq retry --user USER --unblock --why WHY")
}

// follow polls a batch until it ends and prints its result; a cancelled
// batch is an error (exit 1).
func (a *app) follow(cmd *cobra.Command, c *client, id string) error {
	last := -1
	for {
		b, data, err := getBatch(cmd, c, id)
		if err != nil {
			return err
		}
		if b.State != console.BatchRunning {
			if a.json() {
				if err := a.printJSON(data); err != nil {
					return err
				}
			} else {
				printBatchResult(a.out, b)
			}
			if b.State == console.BatchCancelled {
				return failf("batch %s was cancelled by %s after %d of %d letters", b.ID, b.CancelledBy, b.Position, b.Total)
			}
			return nil
		}
		// A retry's letters go back at the DLQ's per-user pace: once all
		// are requeued, the batch runs on until none waits.
		if p := b.Position*1000000 + b.Delivered; p != last {
			fmt.Fprintf(a.errOut, "batch %s: %d/%d%s\n", b.ID, b.Position, b.Total, deliveryText(b))
			last = p
		}
		select {
		case <-cmd.Context().Done():
			return cmd.Context().Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func getBatch(cmd *cobra.Command, c *client, id string) (console.Batch, []byte, error) {
	data, err := c.do(cmd.Context(), "GET", "/admin/dlq/batches/"+url.PathEscape(id), nil, nil)
	if err != nil {
		return console.Batch{}, nil, err
	}
	var b console.Batch
	return b, data, decode(data, &b)
}

// deliveryText is a retry batch's letters back in the main topic and
// those still waiting, once it requeued them all ("" before, and for a
// purge).
func deliveryText(b console.Batch) string {
	if b.Action != console.ActionRetry || b.Position < b.Total || b.Acted == 0 {
		return ""
	}
	t := fmt.Sprintf(" requeued; %d/%d back in the main topic", b.Delivered, b.Acted)
	if b.Waiting > 0 {
		t += fmt.Sprintf(", %d waiting for their due time (the DLQ's per-user pacing)", b.Waiting)
		if b.NextRetry != nil {
			t += ", next " + b.NextRetry.Local().Format(time.TimeOnly)
		}
		if b.LastRetry != nil && (b.NextRetry == nil || !b.LastRetry.Equal(*b.NextRetry)) {
			t += ", last " + b.LastRetry.Local().Format(time.TimeOnly)
		}
	}
	return t
}

func printBatchResult(w io.Writer, b console.Batch) {
	done := map[string]string{console.ActionRetry: "retried", console.ActionPurge: "purged"}[b.Action]
	fmt.Fprintf(w, "%s %d dead letter(s)", done, b.Acted)
	// A retry always says how many it skipped as done, 0 included: the
	// runbook (docs/operations.md) tells the operator to read that figure.
	if b.Action == console.ActionRetry || b.SkippedDone > 0 {
		fmt.Fprintf(w, ", skipped %d already done", b.SkippedDone)
	}
	if b.Gone > 0 {
		fmt.Fprintf(w, ", %d gone meanwhile", b.Gone)
	}
	if b.Action == console.ActionRetry && b.Acted > 0 {
		fmt.Fprintf(w, ", %d back in the main topic", b.Delivered)
		if b.Waiting > 0 {
			fmt.Fprintf(w, ", %d still waiting", b.Waiting)
		}
	}
	fmt.Fprintf(w, " (batch %s, %s)\n", b.ID, b.State)
}

func (a *app) dlqBatches() *cobra.Command {
	return &cobra.Command{
		Use:   "batches",
		Short: "The newest batch retries and purges with their progress",
		Args:  args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var page struct {
				Batches []console.Batch `json:"batches"`
			}
			if printed, err := a.read(cmd, "/admin/dlq/batches", nil, &page); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tACTION\tSTATE\tSELECTED\tACTED\tBACK\tWAITING\tNEXT RETRY\tSKIPPED\tGONE\tWHO\tFILTER")
			for _, b := range page.Batches {
				back, waiting, next := "-", "-", "-"
				if b.Action == console.ActionRetry {
					back, waiting = fmt.Sprintf("%d/%d", b.Delivered, b.Acted), strconv.Itoa(b.Waiting)
					if b.NextRetry != nil {
						next = b.NextRetry.Local().Format(time.TimeOnly)
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", b.ID, b.Action, b.State, b.Position, b.Total,
					b.Acted, back, waiting, next, b.SkippedDone, b.Gone, b.Who, b.Filter)
			}
			return tw.Flush()
		},
	}
}

func (a *app) dlqBatch() *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "batch ID",
		Short: "One batch's progress (--wait: until it ends)",
		Args:  args(1, "the batch ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if wait {
				return a.follow(cmd, c, argv[0])
			}
			b, data, err := getBatch(cmd, c, argv[0])
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(data)
			}
			fmt.Fprintf(a.out, "batch %s: %s %s, %d/%d letters (acted %d, skipped done %d, gone %d) at %d a second\n",
				b.ID, b.Action, b.State, b.Position, b.Total, b.Acted, b.SkippedDone, b.Gone, b.Rate)
			if d := deliveryText(b); d != "" {
				fmt.Fprintf(a.out, "letters%s\n", d)
			}
			fmt.Fprintf(a.out, "by %s: %s\nfilter: %s\n", b.Who, b.Reason, b.Filter)
			if b.Error != "" {
				fmt.Fprintf(a.out, "last error: %s\n", b.Error)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the batch until it ends")
	return cmd
}

func (a *app) dlqCancel() *cobra.Command {
	var reason string
	var dry bool
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Stop a running batch where it is",
		Args:  args(1, "the batch ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := needReason(reason); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if dry {
				b, _, err := getBatch(cmd, c, argv[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(a.out, "dry run: would cancel batch %s (%s, %d/%d letters)\n", b.ID, b.State, b.Position, b.Total)
				return nil
			}
			data, err := c.do(cmd.Context(), "POST", "/admin/dlq/batches/"+url.PathEscape(argv[0])+"/cancel", nil,
				map[string]string{"reason": reason})
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(data)
			}
			fmt.Fprintf(a.out, "cancelled batch %s\n", argv[0])
			return nil
		},
	}
	writeFlags(cmd, &reason, &dry)
	return cmd
}

func (a *app) dlqPurge() *cobra.Command {
	var f filterFlags
	var reason string
	var dry, wait bool
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete the dead letters a filter selects from the index",
		Long: `Delete every dead letter that --user, --failure-reason, --review or --all select
from the DLQ index (the DLQ topic keeps the letters until its retention ends).
Like a batch retry it runs as a paced, cancellable batch this command follows
(--wait=false: print its ID and return).
With --dry-run the server counts what it would delete and deletes nothing.`,
		Args: args(0, "no arguments (select with filter flags)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needReason(reason); err != nil {
				return err
			}
			body, err := f.body(reason, dry)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.batch(cmd, c, "/admin/dlq/purge", body, wait)
		},
	}
	f.add(cmd, true, false)
	writeFlags(cmd, &reason, &dry)
	cmd.Flags().BoolVar(&wait, "wait", true, "follow the batch until it ends")
	return cmd
}

func (a *app) dlqExport() *cobra.Command {
	var f filterFlags
	var format, file string
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Export the selected dead letters with their messages (CSV or JSON lines)",
		Long: `Export every dead letter the filters select, with the original message, as CSV
(the default) or JSON lines (--format json), to stdout or --file. --output does not
apply: the export is written as the server streams it.`,
		Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "csv" && format != "json" {
				return usagef("--format must be csv or json, got %q", format)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			q, err := f.query()
			if err != nil {
				return err
			}
			q.Set("format", format)
			resp, err := c.send(cmd.Context(), "GET", "/admin/dlq/export", q, nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.StatusCode >= 300 {
				data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
				return answerError("GET", "/admin/dlq/export", resp.StatusCode, data)
			}
			out := a.out
			if file != "" {
				fh, err := os.Create(file)
				if err != nil {
					return failf("--file: %v", err)
				}
				defer fh.Close()
				out = fh
			}
			if _, err := io.Copy(out, resp.Body); err != nil {
				return failf("export interrupted: %v", err)
			}
			if file != "" {
				if err := out.(*os.File).Close(); err != nil {
					return failf("--file: %v", err)
				}
			}
			return nil
		},
	}
	f.add(cmd, false, false)
	cmd.Flags().StringVar(&format, "format", "csv", "csv or json (JSON lines)")
	cmd.Flags().StringVarP(&file, "file", "f", "", "write to this file instead of stdout")
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{"csv", "json"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}
