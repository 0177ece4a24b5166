package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func (a *app) accountsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "accounts",
		Short: "Every customer-service account kf-producer syncs, with its sync state",
		Long: `The accounts of the console's overview (GET /admin/overview): every account
kf-producer syncs — listed from WeChat at start and on kf_account_auth_change when
wecom.open_kfids is empty (docs/operations.md, "Accounts") — with its state against
WeChat's 72-hour horizon (ok, warning, critical, stale), its last successful sync, how
long messages have waited and the horizon left. An account discovered but not synced
yet shows no last sync.`,
		Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			data, err := c.do(cmd.Context(), "GET", "/admin/overview", nil, nil)
			if err != nil {
				return err
			}
			var o overview
			if err := decode(data, &o); err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(data)
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ACCOUNT\tSTATE\tLAST SYNC\tWAITING\tHORIZON LEFT")
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
			if len(o.Accounts) == 0 && o.AccountsError == "" {
				fmt.Fprintln(tw, "(no account reported by kf-producer)")
			}
			return tw.Flush()
		},
	}
}
