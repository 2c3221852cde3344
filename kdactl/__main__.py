from kdactl.cli import main

main()
