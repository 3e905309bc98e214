package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of ratectl (also: ratectl --version)",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			b := a.build()
			return a.render(cmd, b, func(w io.Writer) {
				mod := ""
				if b.Modified {
					mod = " (modified)"
				}
				fmt.Fprintf(w, "ratectl %s\ncommit %s%s\nbuilt %s\n%s %s\n", b.Version, b.Commit, mod, b.Date, b.GoVersion, b.Platform)
			})
		}),
	}
}

func newCompletionCmd(a *app, root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script",
		Long: `Print a shell completion script.

  bash:  source <(ratectl completion bash)
  zsh:   ratectl completion zsh > "${fpath[1]}/_ratectl"
  fish:  ratectl completion fish > ~/.config/fish/completions/ratectl.fish`,
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("%s needs one shell: bash, zsh or fish", cmd.CommandPath())
			}
			return nil
		},
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if err := a.refuseJSON(cmd, "it prints a shell script"); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(w, true)
			case "zsh":
				return root.GenZshCompletion(w)
			case "fish":
				return root.GenFishCompletion(w, true)
			default:
				return usagef("completion for %q: supported shells are bash, zsh and fish", args[0])
			}
		}),
	}
}
