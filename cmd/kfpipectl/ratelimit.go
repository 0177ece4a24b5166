package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kfpipe/kfpipe/internal/console"
)

func (a *app) rateLimitCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ratelimit", Short: "Rate limits: status, blocked, block, unblock, group, rules, set-rules"}
	cmd.AddCommand(a.rlStatus(), a.rlBlocked(), a.rlBlock(), a.rlUnblock(), a.rlGroup(), a.rlRules(), a.rlSetRules())
	return cmd
}

func (a *app) rlStatus() *cobra.Command {
	return &cobra.Command{
		Use:   "status USER",
		Short: "A user's rate-limit group and block",
		Args:  args(1, "one user"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			st, data, err := a.status(cmd, c, argv[0])
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(data)
			}
			a.printStatus(st)
			return nil
		},
	}
}

func (a *app) status(cmd *cobra.Command, c *client, user string) (console.RateLimitStatus, []byte, error) {
	var st console.RateLimitStatus
	data, err := c.do(cmd.Context(), "GET", "/admin/ratelimit/status/"+url.PathEscape(user), nil, nil)
	if err != nil {
		return st, nil, err
	}
	return st, data, decode(data, &st)
}

func blockText(blocked, permanent bool, until *time.Time) string {
	switch {
	case !blocked:
		return "no"
	case permanent:
		return "permanently"
	}
	return "until " + fmtTime(until)
}

func (a *app) printStatus(st console.RateLimitStatus) {
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "USER\tGROUP\tBLOCKED")
	fmt.Fprintf(tw, "%s\t%s\t%s\n", st.User, st.Group, blockText(st.Blocked, st.Permanent, st.BlockedUntil))
	_ = tw.Flush()
}

func (a *app) rlBlocked() *cobra.Command {
	var limit int
	var cursor string
	cmd := &cobra.Command{
		Use:   "blocked",
		Short: "Users blocked now, soonest-ending first (one page)",
		Args:  args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			data, err := c.do(cmd.Context(), "GET", "/admin/ratelimit/blocked", onePage(url.Values{}, limit, cursor), nil)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(data)
			}
			var page struct {
				Users      []console.BlockedUser `json:"users"`
				NextCursor string                `json:"next_cursor"`
			}
			if err := decode(data, &page); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "USER\tBLOCKED")
			for _, u := range page.Users {
				fmt.Fprintf(tw, "%s\t%s\n", u.User, blockText(true, u.Permanent, u.BlockedUntil))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if page.NextCursor != "" {
				fmt.Fprintf(a.errOut, "more: kfpipectl ratelimit blocked --cursor %s\n", page.NextCursor)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "page size (1-500)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "the next page's cursor from the previous call")
	return cmd
}

// userWrite runs a per-user write: with --dry-run it reads the user's
// status and says what would be sent, acting on nothing.
func (a *app) userWrite(cmd *cobra.Command, user, path, what string, body map[string]string, dry bool) error {
	if err := needReason(body["reason"]); err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	path += url.PathEscape(user)
	method := "POST"
	if _, ok := body["group"]; ok {
		method = "PUT"
	}
	if dry {
		st, _, err := a.status(cmd, c, user)
		if err != nil {
			return err
		}
		if a.json() {
			return a.printValue(map[string]any{"dry_run": true, "would": method + " " + path, "body": body, "status": st})
		}
		fmt.Fprintf(a.out, "dry run: would %s; now:\n", what)
		a.printStatus(st)
		return nil
	}
	data, err := c.do(cmd.Context(), method, path, nil, body)
	if err != nil {
		return err
	}
	if a.json() {
		return a.printJSON(data)
	}
	fmt.Fprintf(a.out, "done: %s\n", what)
	// An unblock answers the user's letters that still wait for their
	// scheduled retry (after the block's old end): say so, and how to
	// send them now.
	var ans struct {
		WaitingLetters int        `json:"waiting_letters"`
		WaitingUntil   *time.Time `json:"waiting_until"`
	}
	if err := json.Unmarshal(data, &ans); err == nil && ans.WaitingLetters > 0 {
		until := ""
		if ans.WaitingUntil != nil {
			until = " (the last until " + ans.WaitingUntil.UTC().Format(time.RFC3339) + ")"
		}
		fmt.Fprintf(a.out, "%d dead letter(s) of %s still wait for their scheduled retry%s; to retry them now:\n  kfpipectl dlq retry --user %s --why '…'\n",
			ans.WaitingLetters, user, until, user)
	}
	return nil
}

func (a *app) rlBlock() *cobra.Command {
	var reason, period string
	var dry bool
	cmd := &cobra.Command{
		Use:   "block USER",
		Short: "Block a user, for --for or permanently",
		Args:  args(1, "one user"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			what := "block " + argv[0] + " permanently"
			if period != "" && period != "0" {
				d, err := time.ParseDuration(period)
				if err != nil || d <= 0 {
					return usagef("--for must be a duration such as 2h or 90m, got %q", period)
				}
				what = "block " + argv[0] + " for " + d.String()
			}
			return a.userWrite(cmd, argv[0], "/admin/ratelimit/block/", what,
				map[string]string{"reason": reason, "duration": period}, dry)
		},
	}
	cmd.Flags().StringVar(&period, "for", "", "how long, e.g. 2h (empty: permanently)")
	writeFlags(cmd, &reason, &dry)
	return cmd
}

func (a *app) rlUnblock() *cobra.Command {
	var reason string
	var dry bool
	cmd := &cobra.Command{
		Use:   "unblock USER",
		Short: "End a user's block",
		Args:  args(1, "one user"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.userWrite(cmd, argv[0], "/admin/ratelimit/unblock/", "unblock "+argv[0],
				map[string]string{"reason": reason}, dry)
		},
	}
	writeFlags(cmd, &reason, &dry)
	return cmd
}

func (a *app) rlGroup() *cobra.Command {
	var reason string
	var dry bool
	cmd := &cobra.Command{
		Use:   "group USER GROUP",
		Short: "Put a user in a rate-limit group",
		Args:  args(2, "a user and a group"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.userWrite(cmd, argv[0], "/admin/ratelimit/group/", "put "+argv[0]+" in group "+argv[1],
				map[string]string{"reason": reason, "group": argv[1]}, dry)
		},
	}
	writeFlags(cmd, &reason, &dry)
	return cmd
}
