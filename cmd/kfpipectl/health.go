package main

import (
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kfpipe/kfpipe/internal/console"
)

// health is GET /admin/health's answer.
type health struct {
	Status             string           `json:"status"`
	Attention          []string         `json:"attention"`
	Time               time.Time        `json:"time"`
	DLQ                console.DLQStats `json:"dlq"`
	ReviewBacklog      int64            `json:"review_backlog"`
	BlockedUsers       int              `json:"blocked_users"`
	BlockedUsersCapped bool             `json:"blocked_users_capped"`
}

func (a *app) healthCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "health",
		Short: "The on-call overview: DLQ counters, review backlog, blocked users, accounts, lag, consumers",
		Long: `The on-call overview. First the health verdict (GET /admin/verdict): green,
amber or red per area by the alert rules' own bounds, with the rules the values pass.
Then the DLQ's figures from GET /admin/health and the console's overview
(GET /admin/overview) as tables: every WeChat account against the 72-hour horizon,
the main topic's partitions (lag, commit age), the schedule-consumers (actors, open
breakers). The DLQ status is "attention" when dead letters wait for manual review or are
due for a retry now; the command still exits 0 (it answered), scripts read the
status from --output json (the health answer only).`,
		Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			data, err := c.do(cmd.Context(), "GET", "/admin/health", nil, nil)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(data)
			}
			var h health
			if err := decode(data, &h); err != nil {
				return err
			}
			// The verdict leads: it is the answer to "is it healthy?", and a
			// DLQ status of "ok" printed above an amber verdict read as the
			// answer to on-call people.
			vdata, err := c.do(cmd.Context(), "GET", "/admin/verdict", nil, nil)
			if err != nil {
				return err
			}
			var v console.Verdict
			if err := decode(vdata, &v); err != nil {
				return err
			}
			if err := a.printVerdict(v); err != nil {
				return err
			}
			fmt.Fprintln(a.out)
			blocked := strconv.Itoa(h.BlockedUsers)
			if h.BlockedUsersCapped {
				blocked = "≥ " + blocked
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			rows := [][2]string{
				{"dlq status", h.Status}, {"time", h.Time.UTC().Format(time.RFC3339)},
				{"dlq total", fmt.Sprint(h.DLQ.Total)}, {"dlq due", fmt.Sprint(h.DLQ.Due)},
				{"dlq due now", fmt.Sprint(h.DLQ.DueNow)}, {"review backlog", fmt.Sprint(h.ReviewBacklog)},
				{"dlq retried", fmt.Sprint(h.DLQ.Retried)}, {"blocked users", blocked},
			}
			reasons := make([]string, 0, len(h.DLQ.ByReason))
			for r := range h.DLQ.ByReason {
				reasons = append(reasons, r)
			}
			sort.Strings(reasons)
			for _, r := range reasons {
				rows = append(rows, [2]string{"dlq " + r, fmt.Sprint(h.DLQ.ByReason[r])})
			}
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
			}
			for _, s := range h.Attention {
				fmt.Fprintf(tw, "attention\t%s\n", s)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			data, err = c.do(cmd.Context(), "GET", "/admin/overview", nil, nil)
			if err != nil {
				return err
			}
			var o overview
			if err := decode(data, &o); err != nil {
				return err
			}
			return a.printOverview(o)
		},
	}
}

// overview is the part of GET /admin/overview health prints.
type overview struct {
	Accounts []struct {
		OpenKfID           string     `json:"open_kfid"`
		State              string     `json:"state"`
		LastSuccess        *time.Time `json:"last_success"`
		WaitingSeconds     int64      `json:"waiting_seconds"`
		HorizonLeftSeconds *int64     `json:"horizon_left_seconds"`
	} `json:"accounts"`
	AccountsError  string                   `json:"accounts_error"`
	Partitions     []console.PartitionLag   `json:"partitions"`
	LagError       string                   `json:"lag_error"`
	Consumers      []console.ConsumerStatus `json:"consumers"`
	ConsumersError string                   `json:"consumers_error"`
	Actors         int                      `json:"actors"`
	OpenBreakers   int                      `json:"open_breakers"`
}

func (a *app) printOverview(o overview) error {
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nactive actors\t%d\nopen breakers\t%d\n", o.Actors, o.OpenBreakers)
	fmt.Fprintln(tw, "\nACCOUNT\tSTATE\tLAST SYNC\tWAITING\tHORIZON LEFT")
	for _, ac := range o.Accounts {
		left := ""
		if ac.HorizonLeftSeconds != nil {
			left = (time.Duration(*ac.HorizonLeftSeconds) * time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", ac.OpenKfID, ac.State, fmtTime(ac.LastSuccess),
			time.Duration(ac.WaitingSeconds)*time.Second, left)
	}
	if o.AccountsError != "" {
		fmt.Fprintf(tw, "error\t%s\n", o.AccountsError)
	}
	fmt.Fprintln(tw, "\nPARTITION\tEND\tCOMMITTED\tLAG\tCOMMIT AGE")
	for _, p := range o.Partitions {
		age := ""
		if p.CommitAgeSeconds != nil {
			age = (time.Duration(*p.CommitAgeSeconds) * time.Second).String()
			if p.CommitAgeAtLeast {
				age = "≥ " + age
			}
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\n", p.Partition, p.End, p.Committed, p.Lag, age)
	}
	if o.LagError != "" {
		fmt.Fprintf(tw, "error\t%s\n", o.LagError)
	}
	fmt.Fprintln(tw, "\nCONSUMER\tPARTITIONS\tACTORS\tOPEN BREAKERS\tREPORTED")
	for _, c := range o.Consumers {
		rep := c.Reported.UTC().Format(time.RFC3339)
		if c.Stale {
			rep += " (stale)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", c.Node, c.Partitions, c.Actors, c.OpenBreakers, rep)
	}
	if o.ConsumersError != "" {
		fmt.Fprintf(tw, "error\t%s\n", o.ConsumersError)
	}
	return tw.Flush()
}

func (a *app) auditCmd() *cobra.Command {
	var limit int
	var cursor, who, action, target string
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "The audit trail of admin writes, newest first (one page)",
		Args:  args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			for k, v := range map[string]string{"who": who, "action": action, "target": target} {
				if v != "" {
					q.Set(k, v)
				}
			}
			var page struct {
				Entries    []console.AuditEntry `json:"entries"`
				NextCursor string               `json:"next_cursor"`
			}
			if printed, err := a.read(cmd, "/admin/audit", onePage(q, limit, cursor), &page); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tWHO\tACTION\tTARGET\tRESULT\tREASON")
			for _, e := range page.Entries {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Time, e.Who, e.Action, e.Target, e.Result, oneLine(e.Reason))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if page.NextCursor != "" {
				fmt.Fprintf(a.errOut, "more: kfpipectl audit%s --cursor %s\n", auditFlags(who, action, target), page.NextCursor)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "page size (1-500)")
	cmd.Flags().StringVar(&who, "who", "", "only this token name's entries")
	cmd.Flags().StringVar(&action, "action", "", "only this action, or every action under a prefix (dlq, ratelimit)")
	cmd.Flags().StringVar(&target, "target", "", "only entries whose target contains this (a letter ID, user:U, batch=ID)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "the next page's cursor from the previous call")
	return cmd
}

// auditFlags repeats the audit filters for the next page's command line.
func auditFlags(who, action, target string) string {
	out := ""
	for _, f := range [][2]string{{"who", who}, {"action", action}, {"target", target}} {
		if f[1] != "" {
			out += " --" + f[0] + " " + strconv.Quote(f[1])
		}
	}
	return out
}

// printVerdict prints the verdict's areas: colour, what was read, the
// alert rules whose bounds the values pass.
func (a *app) printVerdict(v console.Verdict) error {
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "VERDICT\t%s%s\n", v.State, sinceText(v.Since))
	fmt.Fprintln(tw, "AREA\tSTATE\tDETAIL\tPAST")
	for _, ar := range v.Areas {
		fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\n", ar.Area, ar.State, sinceText(ar.Since), ar.Detail, strings.Join(ar.Firing, ","))
	}
	return tw.Flush()
}

// sinceText is " since 2026-12-06T14:02:00Z" ("" when the console could
// not record when the state began).
func sinceText(t *time.Time) string {
	if t == nil {
		return ""
	}
	return " since " + t.UTC().Format(time.RFC3339)
}
