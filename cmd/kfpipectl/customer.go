package main

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kfpipe/kfpipe/internal/console"
)

func (a *app) customerCmd() *cobra.Command {
	var msgid, window string
	var maxRecords int
	cmd := &cobra.Command{
		Use:   "customer USER",
		Short: `A customer's timeline: "the bot never answered" — every message and where it went, newest first`,
		Long: `The customer's timeline from GET /admin/customers/{user}/timeline: each message the
pipeline still keeps (received on the main topic with partition, offset and time; the
rate limiter's verdict; processed or not and attempts; replies recorded sent; dead
letters and their fates), newest first, then the user's blocks and the operator actions
on the user or their letters. A user nothing is known about says so ("nothing known"),
so a mistyped id does not look like a quiet customer. With the conversation archive
configured the messages are read from it, for any window up to archive.retention; the
first lines say the range of time actually read. Exit 3 (not found) when nothing is known
about the user, or the --msgid asked for is not among the messages; else 0 whenever the
server answered.`,
		Args: args(1, "one user (external_userid)"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			q := url.Values{}
			if msgid != "" {
				q.Set("msgid", msgid)
			}
			if window != "" {
				q.Set("window", window)
			}
			if maxRecords > 0 {
				q.Set("max_records", strconv.Itoa(maxRecords))
			}
			data, err := c.do(cmd.Context(), "GET", "/admin/customers/"+url.PathEscape(argv[0])+"/timeline", q, nil)
			if err != nil {
				return err
			}
			var tl console.Timeline
			if err := decode(data, &tl); err != nil {
				return err
			}
			if a.json() {
				if err := a.printJSON(data); err != nil {
					return err
				}
			} else {
				a.printTimeline(&tl)
			}
			switch {
			case !tl.Known:
				return &exitErr{code: exitNotFound, msg: "not found: " + tl.Summary}
			case msgid != "" && len(tl.Messages) == 0:
				return &exitErr{code: exitNotFound, msg: "not found: message " + msgid + " of user " + tl.User}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&msgid, "msgid", "", "only this message (upstream msgid, message_id or dead letter id)")
	cmd.Flags().StringVar(&window, "window", "", `how far back to read ("24h"; server default 72h; up to archive.retention with the archive, else 336h)`)
	cmd.Flags().IntVar(&maxRecords, "max-records", 0, "read at most this many of the partition's newest records, or of the archive's newest messages (server default 20000)")
	return cmd
}

func (a *app) printTimeline(tl *console.Timeline) {
	w := a.out
	fmt.Fprintf(w, "customer %s\n%s\n", tl.User, tl.Summary)
	if tl.Read != "" {
		whole := "the whole window"
		if !tl.Complete {
			whole = "NOT the whole window"
		}
		fmt.Fprintf(w, "read: %s; %s since %s\n", tl.Read, whole, tl.Since.UTC().Format(time.RFC3339))
	}
	if ar := tl.Archive; ar != nil {
		fmt.Fprintf(w, "archive: partition %d archived up to %s (offset %d)", ar.Partition, ar.ArchivedUpTo.UTC().Format(time.RFC3339), ar.ArchivedOffset)
		if ar.BehindBy > 0 {
			fmt.Fprintf(w, ", behind by %d record(s)", ar.BehindBy)
		}
		fmt.Fprintln(w)
	}
	if t := tl.Topic; t != nil {
		trunc := ""
		if t.Truncated {
			trunc = " (window truncated: older records not read)"
		}
		fmt.Fprintf(w, "read: %s partition %d offsets %d-%d since %s%s\n", t.Topic, t.Partition, t.From, t.To,
			tl.Since.UTC().Format(time.RFC3339), trunc)
	}
	if l := tl.Limiter; l != nil {
		state := "not blocked"
		switch {
		case l.Blocked && l.Permanent:
			state = "BLOCKED permanently"
		case l.Blocked && l.BlockedUntil != nil:
			state = "BLOCKED until " + l.BlockedUntil.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "limiter: group %s, %s\n", l.Group, state)
	}
	var srcs []string
	for _, k := range []string{"archive", "main_topic", "dlq", "dedup", "limiter", "audit"} {
		if v, ok := tl.Sources[k]; ok && v != "ok" {
			srcs = append(srcs, k+" "+v)
		}
	}
	if len(srcs) > 0 {
		fmt.Fprintf(w, "not read: %s\n", strings.Join(srcs, ", "))
	}
	for _, n := range tl.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, m := range tl.Messages {
		when := "send time unknown"
		if m.SendTime != nil {
			when = m.SendTime.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "\n%s  %s  %s", when, strings.ToUpper(strings.ReplaceAll(m.Outcome, "_", " ")), m.UpstreamMsgID)
		if m.Preview != "" {
			fmt.Fprintf(w, "  %q", m.Preview)
		}
		fmt.Fprintf(w, "\n  limiter %s · processed %s · attempts %d\n", m.Limiter, m.Processed, m.Attempts)
		for _, r := range m.Received {
			kind := "received"
			if r.RetryFromDLQ {
				kind = fmt.Sprintf("re-delivered (retry %d)", r.RetryCount)
			}
			fmt.Fprintf(w, "  %s %s partition %d offset %d\n", kind, r.Time.UTC().Format(time.RFC3339), r.Partition, r.Offset)
		}
		for _, l := range m.Letters {
			details := ""
			if l.Details != "" {
				details = " (" + l.Details + ")"
			}
			fmt.Fprintf(w, "  dead letter %s %s%s, state %s, %d retr(ies), failed %s\n", l.ID, l.Reason, details, l.State,
				l.RetryCount, l.FailureTime.UTC().Format(time.RFC3339))
		}
		for _, r := range m.Replies {
			fmt.Fprintf(w, "  reply sent: key %s msgid %s\n", r.Key, r.MsgID)
		}
		fmt.Fprintf(w, "  story: %s\n", m.Story)
	}
	if len(tl.Events) > 0 {
		fmt.Fprintln(w, "\nevents:")
	}
	for _, e := range tl.Events {
		fmt.Fprintf(w, "%s  %s  %s", e.Time.UTC().Format(time.RFC3339), e.Kind, e.What)
		if e.Who != "" {
			fmt.Fprintf(w, "  by %s (%s) %s", e.Who, e.Reason, e.Result)
		}
		if e.AuditID != "" {
			fmt.Fprintf(w, "  audit %s", e.AuditID)
		}
		fmt.Fprintln(w)
	}
}
